"""A local OpenID provider for tests: a real HTTP server on 127.0.0.1 serving discovery and a JWKS,
signing RS256 ID tokens with keys generated here (``local_issuer()``; ``Issuer.token(...)``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI

from joch.server.testing import ServerThread

CLIENT_ID = "joch"


@dataclass
class Issuer:
    """A minimal OpenID provider: discovery, a JWKS it can rotate, and a count of JWKS fetches."""

    thread: ServerThread
    keys: dict[str, rsa.RSAPrivateKey] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    jwks_fetches: int = 0

    @property
    def url(self) -> str:
        return self.thread.url

    def add_key(self, kid: str, *, publish: bool = True) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if publish:
            self.published.append(kid)

    def jwks(self) -> dict[str, Any]:
        self.jwks_fetches += 1
        keys = []
        for kid in self.published:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def token(self, kid: str = "k1", *, audience: str = CLIENT_ID, expires_in: float = 300, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": audience, "sub": "alice", "iat": now, "exp": now + int(expires_in),
                   **claims}
        return jwt.encode(payload, self.keys[kid], algorithm="RS256", headers={"kid": kid})


@contextmanager
def local_issuer() -> Iterator[Issuer]:
    """An ``Issuer`` running on 127.0.0.1 with one published key, ``k1``."""
    app = FastAPI()
    thread = ServerThread(app)
    running = Issuer(thread)
    running.add_key("k1")

    @app.get("/.well-known/openid-configuration")
    def discovery() -> dict[str, Any]:
        return {"issuer": running.url, "jwks_uri": f"{running.url}/keys", "id_token_signing_alg_values_supported":
                ["RS256"]}

    @app.get("/keys")
    def keys() -> dict[str, Any]:
        return running.jwks()

    with thread:
        yield running
