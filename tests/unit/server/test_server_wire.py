"""Request body decoding, Warning headers and query parameter parsing (no server needed)."""

from __future__ import annotations

import math

import pytest

from joch.api import errors
from joch.server import params, resources, wire


def test_warning_header_quotes_escapes_and_flattens() -> None:
    assert wire.warning_header('agent "x" has\nno provider') == '299 - "agent \\"x\\" has no provider"'
    assert wire.warning_header("back\\slash") == '299 - "back\\\\slash"'
    wire.warning_header("emoji ✓").encode("latin-1")


def test_json_response_sets_one_warning_header_per_warning() -> None:
    response = wire.json_response({"a": 1}, status_code=201, warnings=["one", "two"])
    assert response.status_code == 201 and response.body == b'{"a":1}'
    assert response.headers.getlist("warning") == ['299 - "one"', '299 - "two"']


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
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


@pytest.mark.parametrize("content_type", ["application/xml", "text/plain", "image/png", "text/plain; charset=utf-8",
                                          "multipart/form-data; boundary=x"])
def test_decode_rejects_media_types_other_than_json_and_yaml(content_type: str) -> None:
    with pytest.raises(errors.UnsupportedMediaType) as info:
        wire.decode_object(b'{"a": 1}', content_type)
    assert info.value.message == (f"the body's media type {wire.media_type(content_type)!r} is not supported: "
                                  "send application/json or application/yaml and say so in the Content-Type header")


@pytest.mark.parametrize("content_type", [None, "", " ; charset=utf-8"])
def test_a_body_without_a_content_type_is_415_not_a_guess(content_type: str | None) -> None:
    # A page may send such a body cross-origin without a preflight: it must never be read as JSON.
    for call in (lambda: wire.decode_object(b'{"a": 1}', content_type), lambda: wire.require_manifests(content_type)):
        with pytest.raises(errors.UnsupportedMediaType, match="no Content-Type: send application/"):
            call()


def test_a_form_body_gets_the_curl_hint() -> None:
    with pytest.raises(errors.UnsupportedMediaType, match=r"curl -d sends this type: add -H 'Content-Type: appl"):
        wire.decode_object(b'{"a": 1}', "application/x-www-form-urlencoded")


def test_manifest_bodies_are_yaml_or_json() -> None:
    for content_type in ("application/yaml", "text/yaml", "application/json; charset=utf-8"):
        wire.require_manifests(content_type)
    with pytest.raises(errors.UnsupportedMediaType, match="send application/yaml or application/json"):
        wire.require_manifests("text/plain")


def test_deeply_nested_json_is_400_naming_the_line() -> None:
    for depth in (65, 100_000):
        with pytest.raises(errors.BadRequest, match=r"^request body: documents\[0\] \(line 2\): mappings and lists "
                                                    r"nest more than 64 levels deep"):
            wire.decode_object(b'{"spec":\n' + b"[" * depth + b"]" * depth + b"}", "application/json")
    assert wire.decode_object(b'{"spec":' + b"[" * 63 + b"]" * 63 + b"}", "application/json")


def test_a_lone_surrogate_is_400_naming_the_field() -> None:
    with pytest.raises(errors.BadRequest) as info:
        wire.decode_object(b'{"spec":{"text":"x\\ud800y"}}', "application/json")
    assert info.value.message.startswith("request body: spec.text holds a lone UTF-16 surrogate (\\ud800)")
    assert [c.field for c in info.value.causes] == ["spec.text"]
    assert wire.decode_object(b'{"t":"\\ud83d\\ude00"}', "application/json") == {"t": "\U0001f600"}


def test_strategic_merge_is_not_a_patch_type_and_the_415_names_those_that_are() -> None:
    resources.require_patch_type("application/merge-patch+json; charset=utf-8")
    with pytest.raises(errors.UnsupportedMediaType, match=r"merge-patch.*json-patch.*apply-patch"):
        resources.require_patch_type("application/strategic-merge-patch+json")


def test_dry_run_values() -> None:
    assert params.dry_run(None) is False and params.dry_run("") is False and params.dry_run("All") is True
    with pytest.raises(errors.BadRequest, match="All"):
        params.dry_run("all")


def test_watch_revision() -> None:
    assert params.watch_revision(None) is None and params.watch_revision("0") is None
    assert params.watch_revision("42") == "42"
    with pytest.raises(errors.BadRequest, match="resourceVersion"):
        params.watch_revision("-1")


@pytest.mark.parametrize("limit", [-1, params.MAX_LIMIT + 1, 99999999999999999999999])
def test_limits_out_of_range_are_400_naming_limit(limit: int) -> None:
    with pytest.raises(errors.BadRequest) as info:
        params.list_options(None, None, None, limit, None)
    assert info.value.message == (f"invalid limit {limit}: it must be a page size from 1 to 2147483647, "
                                  "or 0 for no limit")
    assert [c.field for c in info.value.causes] == ["limit"]
    assert params.list_options(None, None, None, params.MAX_LIMIT, None).limit == params.MAX_LIMIT


def test_namespaces_in_urls_follow_the_dns_label_rule() -> None:
    assert params.check_namespace("team-a") == "team-a" and params.check_namespace("") is None
    with pytest.raises(errors.BadRequest) as info:
        params.check_namespace("Bad_NS", where="the namespace in the URL")
    assert info.value.message.startswith('the namespace in the URL: "Bad_NS" is not a valid namespace: it must '
                                         "be a lowercase RFC 1123 label")
    assert info.value.message.endswith('(e.g. "bad-ns")')


def test_list_options_treat_zero_limit_as_none() -> None:
    assert params.list_options("ns", "", None, 0, "").limit is None
    opts = params.list_options(None, "a=b", "metadata.name=x", 10, "tok")
    assert (opts.label_selector, opts.field_selector, opts.limit, opts.continue_token) == (
        "a=b", "metadata.name=x", 10, "tok")


def test_json_bodies_decode_exactly_whichever_parser_reads_them() -> None:
    """orjson reads most bodies; what it would read differently (an integer beyond 64 bits, which
    it makes a float) or refuses (NaN) is read by ``json``, as before."""
    head = '{"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}, '
    assert wire.decode_object(f'{head}"n": 123456789012345678901234567890}}'.encode(), wire.JSON)["n"] \
        == 123456789012345678901234567890
    assert wire.decode_object(f'{head}"n": 18446744073709551616}}'.encode(), wire.JSON)["n"] == 2**64
    deep = wire.decode_object(f'{head}"l": [1, {{"n": -18446744073709551617}}], "f": 1e19}}'.encode(), wire.JSON)
    assert deep["l"][1]["n"] == -(2**64) - 1 and deep["f"] == 1e19 and type(deep["f"]) is float
    assert wire.decode_object(f'{head}"n": 18446744073709551615, "m": -9223372036854775808}}'.encode(),
                              wire.JSON)["n"] == 2**64 - 1
    assert math.isnan(wire.decode_object(f'{head}"n": NaN}}'.encode(), wire.JSON)["n"])
    assert wire.decode_object(f'{head}"s": "\u00e9", "f": 1.5}}'.encode(), wire.JSON) == {
        "apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}, "s": "\u00e9", "f": 1.5}


def test_dumps_answers_what_orjson_refuses_as_json_did() -> None:
    assert wire.dumps({"a": "\u00e9", "n": [1, 2.5, None, True]}) == '{"a":"\u00e9","n":[1,2.5,null,true]}'.encode()
    assert wire.dumps({"n": 2**70}) == f'{{"n":{2**70}}}'.encode()
    assert wire.dumps({"m": "bad \ud800"}) == b'{"m":"bad \\ud800"}'
