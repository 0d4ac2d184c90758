"""The guard's parsing of Host values, origins and bind addresses, and the start-up warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from joch.api import errors
from joch.server import guard
from joch.server.auth import options as auth_options
from joch.server.auth.options import AuthOptions


@pytest.mark.parametrize(("value", "parsed"), [
    ("localhost", ("localhost", None)), ("LocalHost:8080", ("localhost", 8080)), ("localhost.", ("localhost", None)),
    ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]", ("::1", None)), ("[::1]:8080", ("::1", 8080)),
    ("joch.example.com:443", ("joch.example.com", 443)),
])
def test_split_host(value: str, parsed: tuple[str, int | None]) -> None:
    assert guard.split_host(value) == parsed


@pytest.mark.parametrize("value", ["", ":8080", "a:b", "a:1:2", "::1", "[::1", "[evil]:80", "[::1]x", "a b",
                                   "evil.example/x", "user@evil.example", "a:123456"])
def test_split_host_refuses_what_is_not_a_host(value: str) -> None:
    assert guard.split_host(value) is None


def test_normalize_origin_is_what_a_browser_sends() -> None:
    assert guard.normalize_origin("HTTPS://App.Example.com:443/") == "https://app.example.com"
    assert guard.normalize_origin("http://localhost:3000") == "http://localhost:3000"
    assert guard.normalize_origin("http://[::1]:3000") == "http://[::1]:3000"


@pytest.mark.parametrize(("value", "message"), [
    ("*", "cannot be allowed"), ("null", "cannot be allowed"), ("app.example.com", "is not an origin"),
    ("https://app.example.com/path", "is not an origin"), ("ftp://app.example.com", "is not an origin"),
    ("https://user@app.example.com", "is not an origin"), ("http://x:99999", "is not a valid origin"),
])
def test_normalize_origin_refuses_anything_else(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        guard.normalize_origin(value)


def test_normalize_host() -> None:
    assert guard.normalize_host("Joch.Example.") == "joch.example"
    assert guard.normalize_host("*") == "*" and guard.normalize_host("[::1]") == "::1"
    assert guard.normalize_host("fe80::1") == "fe80::1"
    with pytest.raises(ValueError, match="has a port: give the name alone"):
        guard.normalize_host("joch.example:8080")
    with pytest.raises(ValueError, match="is not a host name"):
        guard.normalize_host("http://joch.example")


def test_loopback_and_wildcard_addresses() -> None:
    assert all(guard.is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(guard.is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "joch.example"))
    assert all(guard.is_wildcard(h) for h in ("0.0.0.0", "::", "[::]", ""))
    assert not any(guard.is_wildcard(h) for h in ("127.0.0.1", "10.0.0.1", "localhost"))


def test_a_non_loopback_bind_without_an_authenticator_is_refused(tmp_path: Path) -> None:
    auth_options.check_exposure("127.0.0.1", AuthOptions())
    auth_options.check_exposure("localhost", AuthOptions())
    with pytest.raises(errors.BadRequest) as refused:
        auth_options.check_exposure("0.0.0.0", AuthOptions())
    message = refused.value.message
    assert message.startswith("refusing to listen on every address of this machine (0.0.0.0) without authentication")
    assert "--token-file" in message and "--oidc-issuer-url" in message and "127.0.0.1" in message
    with pytest.raises(errors.BadRequest, match=r"refusing to listen on 10\.0\.0\.5"):
        auth_options.check_exposure("10.0.0.5", AuthOptions())
    auth_options.check_exposure("0.0.0.0", AuthOptions(token_file=tmp_path / "tokens.csv"))
