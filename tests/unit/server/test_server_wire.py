"""Request body decoding, Warning headers and query parameter parsing (no server needed)."""

from __future__ import annotations

import pytest

from joch.api import errors
from joch.server import params, wire


def test_warning_header_quotes_escapes_and_flattens() -> None:
    assert wire.warning_header('agent "x" has\nno provider') == '299 - "agent \\"x\\" has no provider"'
    assert wire.warning_header("back\\slash") == '299 - "back\\\\slash"'
    wire.warning_header("emoji ✓").encode("latin-1")


def test_json_response_sets_one_warning_header_per_warning() -> None:
    response = wire.json_response({"a": 1}, status_code=201, warnings=["one", "two"])
    assert response.status_code == 201 and response.body == b'{"a":1}'
    assert response.headers.getlist("warning") == ['299 - "one"', '299 - "two"']


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "application/merge-patch+json"])
def test_decode_json_object(content_type: str | None) -> None:
    assert wire.decode_object(b'{"a": [1]}', content_type) == {"a": [1]}


def test_decode_yaml_object_only_when_allowed() -> None:
    assert wire.decode_object(b"a: 1\nb: x\n", "application/yaml") == {"a": 1, "b": "x"}
    with pytest.raises(errors.UnsupportedMediaType):
        wire.decode_object(b"a: 1\n", "application/yaml", allow_yaml=False)
    with pytest.raises(errors.BadRequest, match="2 objects"):
        wire.decode_object(b"a: 1\n---\nb: 2\n", "text/yaml")


@pytest.mark.parametrize(("body", "message"), [
    (b"", "empty"), (b"{oops", "not valid JSON"), (b"[1]", "JSON object"), (b"\xff\xfe", "JSON"),
])
def test_decode_rejects_bad_bodies(body: bytes, message: str) -> None:
    with pytest.raises(errors.BadRequest, match=message):
        wire.decode_object(body, "application/json")


def test_decode_rejects_unknown_media_types() -> None:
    with pytest.raises(errors.UnsupportedMediaType, match="application/xml"):
        wire.decode_object(b"<a/>", "application/xml")


def test_merge_patch_is_the_only_patch_type() -> None:
    wire.require_merge_patch("application/merge-patch+json; charset=utf-8")
    with pytest.raises(errors.UnsupportedMediaType, match="merge-patch"):
        wire.require_merge_patch("application/json-patch+json")


def test_dry_run_values() -> None:
    assert params.dry_run(None) is False and params.dry_run("") is False and params.dry_run("All") is True
    with pytest.raises(errors.BadRequest, match="All"):
        params.dry_run("all")


def test_watch_revision() -> None:
    assert params.watch_revision(None) is None and params.watch_revision("0") is None
    assert params.watch_revision("42") == "42"
    with pytest.raises(errors.BadRequest, match="resourceVersion"):
        params.watch_revision("-1")


def test_list_options_treat_zero_limit_as_none() -> None:
    assert params.list_options("ns", "", None, 0, "").limit is None
    opts = params.list_options(None, "a=b", "metadata.name=x", 10, "tok")
    assert (opts.label_selector, opts.field_selector, opts.limit, opts.continue_token) == (
        "a=b", "metadata.name=x", 10, "tok")
