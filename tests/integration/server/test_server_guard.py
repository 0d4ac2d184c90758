"""``joch.server.guard`` over a real server: a web page gets nothing, kubectl and the CLI everything.

The attack these replay: with no authentication on loopback, a page the user visits sent three
cross-origin POSTs with no ``Content-Type``, a foreign ``Origin`` and (through DNS rebinding)
``Host: evil.example``, and the server answered 201 to each: a provider whose binary was ``id``, an
agent, and a run of it, executed as the server's user.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import httpx

from joch.api import kinds
from joch.cli.client import Client
from joch.server import ServerOptions
from joch.server.testing import LiveServer, is_status
from support import provider

EVIL = "http://evil.example"
CROSS_SITE = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}
AGENT = {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "a"},
         "spec": {"providerRef": {"name": "p"}}}
RUN = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"},
       "spec": {"agentRef": {"name": "a"}, "implementation": {"inline": {"text": "x"}}}}
KUBECTL = {"User-Agent": "kubectl/v1.30.0 (linux/amd64) kubernetes/7c48c2b", "Accept": "application/json"}


def attack_provider() -> dict[str, Any]:
    return provider("p", binary="id")


def writes(server: LiveServer) -> list[tuple[str, str, dict[str, Any]]]:
    """The three creations of the attack, and the other ways in: the seed's apply and executions."""
    return [
        ("POST", server.path("ap"), attack_provider()),
        ("POST", server.path("agents"), AGENT),
        ("POST", server.path("runs"), RUN),
        ("POST", "/v1/resources/apply", attack_provider()),
        ("POST", "/v1/resources/create", attack_provider()),
        ("POST", "/v1/namespaces/default/executions", RUN),
    ]


def host(server: LiveServer) -> str:
    return server.url.removeprefix("http://")


def assert_nothing_stored(server: LiveServer) -> None:
    for kind in (kinds.AGENT_PROVIDER, kinds.AGENT, kinds.AGENT_RUN):
        assert server.store.list(kind).items == [], kind.kind


def test_the_browser_shaped_attack_is_refused_and_stores_nothing(server: LiveServer) -> None:
    for method, path, obj in writes(server):
        # DNS rebinding: the page's own name in Host, so the browser thinks it is same-origin.
        r = server.http.request(method, path, content=json.dumps(obj), headers={**CROSS_SITE, "Host": "evil.example"})
        assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), (path, r.text)
        assert "--allowed-host evil.example" in r.json()["message"]
        assert "access-control-allow-origin" not in r.headers
        # A plain cross-origin request to 127.0.0.1: the Host is right, the Origin is not.
        r = server.http.request(method, path, content=json.dumps(obj), headers=CROSS_SITE)
        assert r.status_code == 403 and is_status(r.json(), 403, "Forbidden"), (path, r.text)
        assert f"cross-origin request from '{EVIL}' refused" in r.json()["message"]
        assert "access-control-allow-origin" not in r.headers
        # What an old browser sends for a form or a no-cors fetch: no Origin, no Sec-Fetch-*.
        for content_type in (None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                             "multipart/form-data; boundary=x"):
            headers = {"Content-Type": content_type} if content_type else {}
            r = server.http.request(method, path, content=json.dumps(obj), headers=headers)
            assert r.status_code == 415 and is_status(r.json(), 415, "UnsupportedMediaType"), (path, content_type)
    assert_nothing_stored(server)


def test_a_cross_origin_page_cannot_cancel_or_decide_either(server: LiveServer) -> None:
    server.create(provider("p"))
    server.create(AGENT)
    run = server.create(RUN)
    server.create({"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "Approval", "metadata": {"name": "g"},
                   "spec": {"runRef": {"name": "r"}}})
    attempts = [
        ("POST", "/v1/namespaces/default/approvals/g/decide", b'{"decision":"approve"}', "text/plain"),
        ("POST", "/v1/namespaces/default/approvals/g/decide", b"", None),  # body-less is still a write
        ("PATCH", server.path("runs", "r"), b'{"spec":{"cancel":true}}', "application/merge-patch+json"),
        ("PUT", server.path("runs", "r"), json.dumps(run).encode(), "application/json"),
        ("DELETE", server.path("runs", "r"), b"", None),
    ]
    for method, path, body, content_type in attempts:
        headers = {**CROSS_SITE, **({"Content-Type": content_type} if content_type else {})}
        r = server.http.request(method, path, content=body, headers=headers)
        assert r.status_code == 403 and is_status(r.json(), 403, "Forbidden"), (method, path, r.text)
    stored = server.store.get(kinds.AGENT_RUN, "default", "r")
    assert stored["metadata"]["resourceVersion"] == run["metadata"]["resourceVersion"]
    assert "status" not in server.store.get(kinds.APPROVAL, "default", "g")


FOREIGN = ["evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.nip.io", "EVIL.example.",
           "evil.example:80:80", "a b", "[evil]", "localhost:http", "[::1"]


def test_a_foreign_host_is_refused_for_reads_too(server: LiveServer) -> None:
    # With DNS rebinding the page can read answers: even a GET must not be served.
    for foreign in FOREIGN:
        for path in ("/apis", server.path("ap"), "/v1/resources/watch"):
            r = server.http.get(path, headers={"Host": foreign})
            assert r.status_code == 400 and is_status(r.json(), 400, "BadRequest"), (foreign, path, r.text)
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as raw:
        raw.sendall(b"GET /apis HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        assert raw.makefile("rb").readline().split()[1] == b"400"


def test_loopback_names_and_addresses_are_answered_on_any_port(server: LiveServer) -> None:
    for name in ("localhost", "LOCALHOST", "localhost.", "127.0.0.1", "[::1]", "10.1.2.3"):
        for suffix in ("", ":8080", f":{server.url.rsplit(':', 1)[1]}"):
            r = server.http.get("/apis", headers={"Host": name + suffix})
            assert r.status_code == 200, (name + suffix, r.text)


def test_kubectl_shaped_requests_work(server: LiveServer) -> None:
    json_headers = {**KUBECTL, "Content-Type": "application/json"}
    r = server.http.post(server.path("ap"), content=json.dumps(provider("p")), headers=json_headers)
    assert r.status_code == 201, r.text
    r = server.http.patch(server.path("ap", "p"), content='{"metadata":{"labels":{"a":"b"}}}',
                          headers={**KUBECTL, "Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    table = {**KUBECTL, "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    assert server.http.get(server.path("ap"), headers=table).json()["kind"] == "Table"
    with server.http.stream("GET", server.path("ap"), params={"watch": "1", "timeoutSeconds": "1"},
                            headers=KUBECTL) as watch:
        assert watch.status_code == 200 and json.loads(next(watch.iter_lines()))["type"] == "ADDED"
    r = server.http.request("DELETE", server.path("ap", "p"), headers=json_headers,
                            content='{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}')
    assert r.status_code == 200, r.text
    # Server-side apply and strategic merge reach the route: apply asks for its fieldManager, and
    # strategic merge is named as a type the route does not take.
    server.create(provider("p"))
    r = server.http.patch(server.path("ap", "p"), content="{}",
                          headers={**KUBECTL, "Content-Type": "application/apply-patch+yaml"})
    assert is_status(r.json(), 400, "BadRequest") and "fieldManager" in r.json()["message"]
    r = server.http.patch(server.path("ap", "p"), content="{}",
                          headers={**KUBECTL, "Content-Type": "application/strategic-merge-patch+json"})
    assert is_status(r.json(), 415, "UnsupportedMediaType") and "merge-patch+json" in r.json()["message"]
    # The seed's custom WATCH method (no browser can send it without a preflight).
    r = server.http.request("WATCH", "/v1/resources", params={"timeoutSeconds": "1"})
    assert r.status_code == 200


def test_cli_shaped_requests_work(server: LiveServer) -> None:
    client = Client(base_url=server.url, on_warning=lambda _: None)
    try:
        client.request("POST", "/v1/resources/apply", content=json.dumps(provider("p")),
                       content_type="application/yaml")
        client.request("POST", server.path("agents"), json_body=AGENT)
        client.request("POST", server.path("runs"), json_body=RUN)
        client.request("PATCH", server.path("runs", "r"), content='{"spec":{"cancel":true}}',
                       content_type="application/merge-patch+json")
        assert client.get_object(server.path("runs", "r"))["spec"]["cancel"] is True
        client.request("DELETE", server.path("runs", "r"))
    finally:
        client.close()
    localhost = server.url.replace("127.0.0.1", "localhost")
    assert httpx.get(f"{localhost}/apis", timeout=10).status_code == 200


def test_the_servers_own_pages_may_write(server: LiveServer) -> None:
    # The Swagger UI at /docs is served by the server itself: its requests are same-origin.
    same = {"Origin": server.url, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors",
            "Content-Type": "application/json"}
    r = server.http.post(server.path("ap"), content=json.dumps(provider("p")), headers=same)
    assert r.status_code == 201, r.text
    assert "access-control-allow-origin" not in r.headers
    # Reached as localhost, the page's origin is http://localhost:PORT and so is its Host.
    localhost = server.url.replace("127.0.0.1", "localhost")
    r = server.http.get(server.path("ap"), headers={**same, "Origin": localhost, "Host": localhost[7:]})
    assert r.status_code == 200, r.text
    # Another port on the same host is another origin.
    other_port = "http://127.0.0.1:1"
    r = server.http.get(server.path("ap"), headers={**same, "Origin": other_port, "Sec-Fetch-Site": "same-site"})
    assert is_status(r.json(), 403, "Forbidden")


def test_cross_origin_reads_are_refused_but_a_followed_link_opens(server: LiveServer) -> None:
    for headers in (CROSS_SITE, {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
                    {"Origin": "null"}):
        for path in ("/apis", server.path("ap"), "/v1/resources/watch"):
            r = server.http.get(path, headers=headers)
            assert is_status(r.json(), 403, "Forbidden"), (headers, path)
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    r = server.http.get("/docs", headers=navigation)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = server.http.post(server.path("ap"), json=provider("p"), headers=navigation)  # a form's submit navigates
    assert is_status(r.json(), 403, "Forbidden")
    assert_nothing_stored(server)


def test_a_page_cannot_frame_the_server(server: LiveServer) -> None:
    # A navigation inside a frame is a navigation too (Sec-Fetch-Mode: navigate), but of a frame the
    # foreign page holds: it could frame /docs and steer the user's clicks onto Swagger UI's buttons
    # (clickjacking), or hold watches open in hidden frames. Only a top-level one opens.
    framed = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    for dest in ("iframe", "frame", "embed", "object"):
        for path in ("/docs", f"{server.path('ap')}?watch=1&timeoutSeconds=1", "/v1/resources/watch?timeoutSeconds=1"):
            r = server.http.get(path, headers={**framed, "Sec-Fetch-Dest": dest})
            assert is_status(r.json(), 403, "Forbidden"), (dest, path)
    # Browsers that send no Sec-Fetch-* are told by every response, refused or not, not to frame it.
    for r in (server.http.get("/docs"), server.http.get(server.path("ap")),
              server.http.get("/apis", headers=CROSS_SITE), server.http.post(server.path("ap"), content=b"{}")):
        assert r.headers["x-frame-options"] == "DENY", r.request.url
        assert r.headers["content-security-policy"] == "frame-ancestors 'none'"
        assert r.headers["x-content-type-options"] == "nosniff"


def test_an_allowed_origin_gets_cors_and_no_other_does(server_with: Callable[..., LiveServer]) -> None:
    app_origin = "http://localhost:3000"
    server = server_with(ServerOptions(allowed_origins=("HTTP://LocalHost:3000/",)))
    preflight = {"Origin": app_origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type", "Sec-Fetch-Site": "same-site"}
    r = server.http.options(server.path("ap"), headers=preflight)
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == app_origin
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "content-type" and r.headers["vary"] == "Origin"
    assert "access-control-allow-private-network" not in r.headers
    r = server.http.options(server.path("ap"), headers={**preflight, "Access-Control-Request-Private-Network": "true"})
    assert r.status_code == 204 and r.headers["access-control-allow-private-network"] == "true"
    r = server.http.post(server.path("ap"), json=provider("p"), headers={"Origin": app_origin,
                                                                        "Sec-Fetch-Site": "same-site"})
    assert r.status_code == 201 and r.headers["access-control-allow-origin"] == app_origin
    assert r.headers["access-control-expose-headers"] == "Warning" and "Origin" in r.headers["vary"]
    # A type a page may send without a preflight is still no write; the page may read why.
    r = server.http.post(server.path("ap"), content=json.dumps(provider("q")),
                         headers={"Origin": app_origin, "Content-Type": "text/plain"})
    assert is_status(r.json(), 415, "UnsupportedMediaType")
    assert r.headers["access-control-allow-origin"] == app_origin
    # Any other origin: refused, preflight included, and never a CORS header.
    for method, headers in (("OPTIONS", {**preflight, "Origin": EVIL}), ("POST", CROSS_SITE),
                            ("GET", CROSS_SITE)):
        r = server.http.request(method, server.path("ap"), json=provider("q"), headers=headers)
        assert is_status(r.json(), 403, "Forbidden") and "access-control-allow-origin" not in r.headers
    r = server.http.get(server.path("ap"))
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)
    assert [p["metadata"]["name"] for p in server.store.list(kinds.AGENT_PROVIDER).items] == ["p"]


def test_allowed_hosts_and_the_bind_host(server_with: Callable[..., LiveServer]) -> None:
    named = server_with(ServerOptions(bind_host="joch.internal", allowed_hosts=("Proxy.Example",)))
    for name in ("joch.internal", "proxy.example:443", "localhost"):
        assert named.http.get("/apis", headers={"Host": name}).status_code == 200, name
    assert is_status(named.http.get("/apis", headers={"Host": "other.example"}).json(), 400, "BadRequest")
    anywhere = server_with(ServerOptions(bind_host="0.0.0.0"))  # what the guard sees; the socket is 127.0.0.1
    assert anywhere.http.get("/apis", headers={"Host": f"{socket.gethostname()}:8080"}).status_code == 200
    assert is_status(anywhere.http.get("/apis", headers={"Host": "evil.example"}).json(), 400, "BadRequest")
    everything = server_with(ServerOptions(allowed_hosts=("*",)))
    assert everything.http.get("/apis", headers={"Host": "whatever.example"}).status_code == 200
    # "*" is about Host only: cross-origin pages stay out.
    r = everything.http.get("/apis", headers={**CROSS_SITE, "Host": "whatever.example"})
    assert is_status(r.json(), 403, "Forbidden")


def test_a_body_with_no_content_type_is_415_naming_the_header(server: LiveServer) -> None:
    r = server.http.post(server.path("ap"), content=json.dumps(provider("p")))
    assert is_status(r.json(), 415, "UnsupportedMediaType")
    assert "Content-Type" in r.json()["message"] and "application/json" in r.json()["message"]
    r = server.http.request("DELETE", server.path("ap", "p"), content=b'{"kind":"DeleteOptions"}')
    assert is_status(r.json(), 415, "UnsupportedMediaType"), r.text
    assert_nothing_stored(server)
