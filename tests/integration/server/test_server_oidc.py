"""OIDC ID tokens from a local issuer (``support.oidc``): a real HTTP server on 127.0.0.1 serving
discovery and JWKS, signing RS256 tokens with keys generated here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from joch.server import ServerOptions
from joch.server.auth.options import AuthOptions, OIDCOptions
from joch.server.testing import LiveServer, is_status, live_server
from joch.store import Store, open_store
from support.oidc import CLIENT_ID, Issuer, local_issuer


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    with local_issuer() as running:
        yield running


@pytest.fixture
def oidc_store(sqlite_url: str) -> Iterator[Store]:
    store = open_store(sqlite_url)
    yield store
    store.close()


def server(store: Store, issuer: Issuer, **oidc: Any) -> Any:
    options = OIDCOptions(issuer_url=issuer.url, client_id=CLIENT_ID, **oidc)
    return live_server(store, ServerOptions(auth=AuthOptions(oidc=options)))


def whoami(joch: LiveServer, token: str) -> httpx.Response:
    return joch.http.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"})


def test_a_good_token_is_the_user_its_claims_name(oidc_store: Store, issuer: Issuer) -> None:
    with server(oidc_store, issuer, username_claim="email", groups_claim="groups", groups_prefix="oidc:") as joch:
        token = issuer.token(email="alice@example.com", email_verified=True, groups=["admins", "devs"])
        r = whoami(joch, token)
        assert r.status_code == 200, r.text
        assert r.json() == {"username": "alice@example.com",
                            "groups": ["oidc:admins", "oidc:devs", "system:authenticated"]}
        unverified = issuer.token(email="mallory@example.com", email_verified=False)
        assert whoami(joch, unverified).status_code == 401


def test_the_username_is_prefixed_with_the_issuer_by_default_and_masters_bootstrap(
    oidc_store: Store, issuer: Issuer,
) -> None:
    with server(oidc_store, issuer, groups_claim="groups") as joch:
        r = whoami(joch, issuer.token(groups="system:masters"))
        assert r.json()["username"] == f"{issuer.url}#alice"
        secrets = joch.http.get("/apis/ops.joch.dev/v1alpha1/namespaces/default/secrets",
                                headers={"Authorization": f"Bearer {issuer.token(groups='system:masters')}"})
        assert secrets.status_code == 200
        assert whoami(joch, issuer.token(groups=7)).status_code == 401  # a claim of the wrong type


def test_wrong_audience_expired_future_and_foreign_tokens_get_the_same_401(
    oidc_store: Store, issuer: Issuer,
) -> None:
    issuer.add_key("stranger", publish=False)
    with server(oidc_store, issuer) as joch:
        assert whoami(joch, issuer.token()).status_code == 200
        bad = [
            issuer.token(audience="another-client"),
            issuer.token(expires_in=-120),  # beyond the 60 s of clock skew
            issuer.token(nbf=int(time.time()) + 600),
            issuer.token(iss="https://evil.example"),
            issuer.token("stranger"),  # a key the issuer never published
            jwt.encode({"iss": issuer.url, "aud": CLIENT_ID, "sub": "alice", "exp": int(time.time()) + 60}, None,
                       algorithm="none"),
        ]
        bodies = set()
        for token in bad:
            r = whoami(joch, token)
            assert r.status_code == 401 and is_status(r.json(), 401, "Unauthorized")
            bodies.add(r.content)
        assert len(bodies) == 1
        assert whoami(joch, issuer.token(expires_in=-30)).status_code == 200  # within the clock skew


def test_an_unknown_key_id_refetches_the_keys_at_most_once_per_interval(oidc_store: Store, issuer: Issuer) -> None:
    with server(oidc_store, issuer, refetch_interval_seconds=0.5) as joch:
        assert whoami(joch, issuer.token()).status_code == 200
        assert issuer.jwks_fetches == 1
        issuer.add_key("k2")  # the issuer rotates: a new key, published
        time.sleep(0.5)
        assert whoami(joch, issuer.token("k2")).status_code == 200
        assert issuer.jwks_fetches == 2
        issuer.add_key("k3", publish=False)
        for _ in range(5):  # forged key ids cannot make the server hammer the issuer
            assert whoami(joch, issuer.token("k3")).status_code == 401
        assert issuer.jwks_fetches <= 3


def test_an_issuer_that_is_down_does_not_stop_the_server(oidc_store: Store, tmp_path: Path) -> None:
    options = OIDCOptions(issuer_url="http://127.0.0.1:9", client_id=CLIENT_ID)
    with live_server(oidc_store, ServerOptions(auth=AuthOptions(oidc=options))) as joch:
        assert joch.http.get("/healthz").status_code == 200
        assert whoami(joch, "e30.e30.e30").status_code == 401
