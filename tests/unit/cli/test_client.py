"""The client turns every transport failure and Status body into a JochError with its exit code."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from joch.api import errors
from joch.cli.client import Client, server_url

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler, warnings: list[str] | None = None) -> Client:
    sink = warnings if warnings is not None else []
    return Client(base_url="http://joch.test", on_warning=sink.append, transport=httpx.MockTransport(handler))


def status(code: int, reason: str, message: str, causes: list[dict[str, str]] | None = None) -> httpx.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message, "details": {"causes": causes or []}}
    return httpx.Response(code, json=body)


@pytest.mark.parametrize(
    ("code", "reason", "cls", "exit_code"),
    [(404, "NotFound", errors.NotFound, 3), (422, "Invalid", errors.Invalid, 2), (409, "Conflict", errors.Conflict, 5),
     (409, "AlreadyExists", errors.AlreadyExists, 5), (410, "Expired", errors.Gone, 6),
     (403, "Forbidden", errors.Forbidden, 4), (500, "InternalError", errors.Internal, 1)],
)
def test_status_bodies_become_the_matching_error(
    code: int, reason: str, cls: type[errors.JochError], exit_code: int
) -> None:
    c = client(lambda _: status(code, reason, "nope", [{"field": "spec.x", "message": "bad"}]))
    with pytest.raises(cls) as caught:
        c.get_json("/anything")
    assert caught.value.exit_code == exit_code
    assert caught.value.message == "nope"
    assert [(x.field, x.message) for x in caught.value.causes] == [("spec.x", "bad")]


@pytest.mark.parametrize(
    ("response", "answered"),
    [(httpx.Response(404, text="<html>not here</html>", headers={"content-type": "text/html"}),
      "GET /apis answered 404 text/html"),
     (httpx.Response(404, json={"detail": "Not Found"}), "GET /apis answered 404 application/json"),
     (httpx.Response(200, text="<html>hello</html>", headers={"content-type": "text/html; charset=utf-8"}),
      "GET /apis answered 200 text/html"),
     (httpx.Response(500), "GET /apis answered 500 an empty body")],
)
def test_a_server_that_is_not_joch_is_named_with_exit_code_7(response: httpx.Response, answered: str) -> None:
    with pytest.raises(errors.ServiceUnavailable) as caught:
        client(lambda _: response).get_json("/apis")
    assert caught.value.exit_code == 7
    assert caught.value.message == f"http://joch.test is not a Joch API server ({answered})"


def test_a_gateway_error_without_a_status_is_unavailable() -> None:
    with pytest.raises(errors.ServiceUnavailable, match="GET /apis answered 502 Bad Gateway") as caught:
        client(lambda _: httpx.Response(502, text="<html>bad gateway</html>")).get_json("/apis")
    assert caught.value.message.startswith("cannot reach the Joch server at http://joch.test: ")


def test_a_redirect_is_not_followed_and_names_its_target() -> None:
    moved = httpx.Response(301, headers={"location": "https://elsewhere.test/apis"})
    with pytest.raises(errors.ServiceUnavailable, match=r"a redirect to https://elsewhere\.test/apis"):
        client(lambda _: moved).get_json("/apis")


def test_json_that_is_not_an_object_is_not_joch() -> None:
    with pytest.raises(errors.ServiceUnavailable, match="is not a Joch API server"):
        client(lambda _: httpx.Response(200, json=[1, 2])).get_object("/apis")


def _raising(exc: type[Exception]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if issubclass(exc, httpx.RequestError):
            raise exc("boom", request=request)
        raise exc("boom")

    return handler


@pytest.mark.parametrize(
    ("exc", "cls", "text"),
    [(httpx.ReadTimeout, errors.ServiceUnavailable, "did not answer GET /apis in time"),
     (httpx.ConnectTimeout, errors.ServiceUnavailable, "did not answer GET /apis in time"),
     (httpx.PoolTimeout, errors.ServiceUnavailable, "did not answer GET /apis in time"),
     (httpx.RemoteProtocolError, errors.ServiceUnavailable, "no valid HTTP answer from http://joch.test"),
     (httpx.LocalProtocolError, errors.ServiceUnavailable, "no valid HTTP answer"),
     (httpx.DecodingError, errors.ServiceUnavailable, "no valid HTTP answer"),
     (httpx.TooManyRedirects, errors.ServiceUnavailable, "no valid HTTP answer"),
     (httpx.ReadError, errors.ServiceUnavailable, "GET /apis to the Joch server at http://joch.test failed"),
     (httpx.ProxyError, errors.ServiceUnavailable, "failed: boom"),
     (httpx.UnsupportedProtocol, errors.BadRequest, "cannot send GET /apis to http://joch.test"),
     (httpx.InvalidURL, errors.BadRequest, "cannot send GET /apis"),
     (httpx.StreamConsumed, errors.ServiceUnavailable, "failed")],
)
def test_every_httpx_failure_is_one_joch_error(exc: type[Exception], cls: type[errors.JochError], text: str) -> None:
    if exc is httpx.StreamConsumed:
        handler: Handler = lambda _: (_ for _ in ()).throw(httpx.StreamConsumed())  # noqa: E731
    else:
        handler = _raising(exc)
    with pytest.raises(cls, match=text) as caught:
        client(handler).get_json("/apis")
    assert caught.value.exit_code == (7 if cls is errors.ServiceUnavailable else 2)
    with pytest.raises(cls):
        list(client(handler).stream("/apis", {"watch": "1"}))


def test_a_refused_connection_is_one_clear_line_with_exit_code_7() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(errors.ServiceUnavailable) as caught:
        client(refuse).get_json("/apis")
    assert caught.value.exit_code == 7
    assert caught.value.message == "cannot reach the Joch server at http://joch.test (is `joch server` running?)"


def test_warning_headers_are_unquoted_and_reported_once() -> None:
    headers = [("Warning", '299 - "agent \\"coder\\" refers to a missing provider"'),
               ("Warning", '299 - "second, with a comma"')]
    warnings: list[str] = []
    c = client(lambda _: httpx.Response(200, json={}, headers=headers), warnings)
    c.get_json("/a")
    c.get_json("/b")
    assert warnings == ['agent "coder" refers to a missing provider', "second, with a comma"]


def test_a_watch_stream_yields_events_and_a_failed_watch_raises() -> None:
    lines = "\n".join(json.dumps({"type": t, "object": {"n": i}}) for i, t in enumerate(["ADDED", "MODIFIED"]))
    c = client(lambda _: httpx.Response(200, text=lines + "\n\n"))
    assert [e["type"] for e in c.stream("/w", {"watch": "1"})] == ["ADDED", "MODIFIED"]
    c = client(lambda _: status(410, "Expired", "too old"))
    with pytest.raises(errors.Gone, match="too old"):
        list(c.stream("/w", {"watch": "1"}))


def test_server_url_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOCH_SERVER", raising=False)
    assert server_url(None) == "http://127.0.0.1:8080"
    monkeypatch.setenv("JOCH_SERVER", "http://env:1/")
    assert server_url(None) == "http://env:1"
    assert server_url("https://flag:2") == "https://flag:2"
    with pytest.raises(errors.BadRequest, match="must start with http"):
        server_url("localhost:8080")


@pytest.mark.parametrize(
    ("url", "problem"),
    [("http://[::1", "is not a valid URL (Invalid IPv6 URL)"), ("http://127.0.0.1:99999", "is not a valid URL"),
     ("http://127.0.0.1:port", "is not a valid URL"), ("http://", "names no host"), ("http://:8080", "names no host"),
     ("http://h:1/?x=1", "must not have a query")],
)
def test_a_malformed_server_url_is_a_clear_error_naming_its_source(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        server_url(url)
    assert caught.value.message.startswith(f'the server URL "{url}" (--server) {problem}')
    assert caught.value.message.endswith("give http://HOST[:PORT], e.g. http://127.0.0.1:8080")
    monkeypatch.setenv("JOCH_SERVER", url)
    with pytest.raises(errors.BadRequest, match=r"\(JOCH_SERVER\)"):
        server_url(None)
