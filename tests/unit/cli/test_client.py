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


def test_a_body_that_is_not_a_status_is_mapped_from_the_http_code() -> None:
    c = client(lambda _: httpx.Response(404, text="<html>not here</html>"))
    with pytest.raises(errors.NotFound, match="not here"):
        c.get_json("/x")
    c = client(lambda _: httpx.Response(502, json={"detail": "bad gateway"}))
    with pytest.raises(errors.Internal, match="bad gateway"):
        c.get_json("/x")


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


def test_non_json_success_is_an_internal_error() -> None:
    with pytest.raises(errors.Internal, match="not JSON"):
        client(lambda _: httpx.Response(200, text="<html>")).get_json("/x")


def test_server_url_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOCH_SERVER", raising=False)
    assert server_url(None) == "http://127.0.0.1:8080"
    monkeypatch.setenv("JOCH_SERVER", "http://env:1/")
    assert server_url(None) == "http://env:1"
    assert server_url("https://flag:2") == "https://flag:2"
    with pytest.raises(errors.BadRequest, match="must start with http"):
        server_url("localhost:8080")
