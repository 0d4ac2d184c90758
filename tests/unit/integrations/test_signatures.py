"""Webhook signatures: GitHub's ``sha256=`` header, Linear's bare hex and its timestamp, the generic one."""

from __future__ import annotations

import hashlib
import hmac
import json

from hypothesis import given
from hypothesis import strategies as st

from joch.integrations import signatures

SECRET = b"s3cret"
BODY = b'{"action":"opened","issue":{"number":12}}'
HEX = hmac.new(SECRET, BODY, hashlib.sha256).hexdigest()


def test_github_accepts_its_signature_and_nothing_else() -> None:
    assert signatures.verify_github(SECRET, BODY, f"sha256={HEX}")
    assert signatures.verify_github(SECRET, BODY, f"sha256={HEX.upper()}")
    assert not signatures.verify_github(SECRET, BODY, HEX)  # no prefix
    assert not signatures.verify_github(SECRET, BODY, None)
    assert not signatures.verify_github(SECRET, BODY, "")
    assert not signatures.verify_github(SECRET, BODY, f"sha1={HEX}")
    assert not signatures.verify_github(b"other", BODY, f"sha256={HEX}")
    assert not signatures.verify_github(SECRET, BODY + b" ", f"sha256={HEX}")
    assert not signatures.verify_github(SECRET, BODY, "sha256=ünïcode")  # never raises


def test_linear_takes_the_bare_hex() -> None:
    assert signatures.verify_linear(SECRET, BODY, HEX)
    assert not signatures.verify_linear(SECRET, BODY, f"sha256={HEX}")
    assert not signatures.verify_linear(SECRET, BODY, None)
    assert not signatures.verify_linear(SECRET, b"{}", HEX)


def test_linear_freshness_by_webhook_timestamp_in_milliseconds() -> None:
    now = 1_800_000_000.0
    assert signatures.linear_fresh({"webhookTimestamp": int(now * 1000)}, now)
    assert signatures.linear_fresh({"webhookTimestamp": int((now - 59) * 1000)}, now)
    assert not signatures.linear_fresh({"webhookTimestamp": int((now - 61) * 1000)}, now)
    assert not signatures.linear_fresh({"webhookTimestamp": int((now + 61) * 1000)}, now)  # from the future
    assert signatures.linear_fresh({"webhookTimestamp": int((now - 200) * 1000)}, now, tolerance=300)
    assert not signatures.linear_fresh({}, now)
    assert not signatures.linear_fresh({"webhookTimestamp": "1800000000000"}, now)
    assert not signatures.linear_fresh({"webhookTimestamp": True}, now)
    assert not signatures.linear_fresh({"webhookTimestamp": now}, now)  # seconds, not ms: 1970


def test_generic_reads_either_header_case_insensitively() -> None:
    assert signatures.verify_generic(SECRET, BODY, {"X-Joch-Signature-256": f"sha256={HEX}"})
    assert signatures.verify_generic(SECRET, BODY, {"x-hub-signature-256": f"sha256={HEX}"})
    assert not signatures.verify_generic(SECRET, BODY, {"X-Joch-Signature-256": HEX})
    assert not signatures.verify_generic(SECRET, BODY, {})


@given(secret=st.binary(min_size=1, max_size=64), body=st.binary(max_size=512))
def test_sign_then_verify_round_trips(secret: bytes, body: bytes) -> None:
    digest = signatures.sign(secret, body)
    assert signatures.verify_linear(secret, body, digest)
    assert signatures.verify_github(secret, body, "sha256=" + digest)
    assert not signatures.verify_linear(secret + b"x", body, digest)


def test_a_reserialised_body_does_not_verify() -> None:
    """The raw bytes are signed: parsing and dumping the JSON again changes them."""
    again = json.dumps(json.loads(BODY)).encode()
    assert again != BODY
    assert not signatures.verify_linear(SECRET, again, HEX)
