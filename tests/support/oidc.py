"""A local OpenID provider for tests: a real HTTP server on 127.0.0.1 serving discovery and a JWKS,
signing RS256 ID tokens with keys generated here (``local_issuer()``; ``Issuer.token(...)``).

It also runs the authorization-code flow with PKCE as a browser meets it (the web console's
single sign-on): ``/authorize`` signs ``Issuer.login`` in without asking and redirects back with a
code; ``/token`` exchanges the code for an ID token once, only with the verifier whose S256
challenge came with it, the same client id and redirect URI. Discovery and the token endpoint send
``Access-Control-Allow-Origin: *``, as providers do for public clients."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse

from joch.server.testing import ServerThread

CLIENT_ID = "joch"
CORS = {"Access-Control-Allow-Origin": "*"}


@dataclass
class Issuer:
    """A minimal OpenID provider: discovery, a JWKS it can rotate, and a count of JWKS fetches."""

    thread: ServerThread
    keys: dict[str, rsa.RSAPrivateKey] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    jwks_fetches: int = 0
    login: dict[str, Any] = field(default_factory=lambda: {"sub": "alice"})  # who /authorize signs in
    codes: dict[str, dict[str, str]] = field(default_factory=dict)

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
    def discovery() -> JSONResponse:
        return JSONResponse({"issuer": running.url, "jwks_uri": f"{running.url}/keys",
                             "authorization_endpoint": f"{running.url}/authorize",
                             "token_endpoint": f"{running.url}/token",
                             "code_challenge_methods_supported": ["S256"],
                             "id_token_signing_alg_values_supported": ["RS256"]}, headers=CORS)

    @app.get("/authorize")
    def authorize(request: Request) -> RedirectResponse:
        q = request.query_params
        code = secrets.token_urlsafe(16)
        running.codes[code] = {k: q.get(k) or "" for k in ("client_id", "redirect_uri", "nonce", "code_challenge",
                                                           "code_challenge_method")}
        return RedirectResponse(f"{q['redirect_uri']}?code={code}&state={q.get('state', '')}", status_code=302)

    @app.post("/token")
    async def token(request: Request) -> JSONResponse:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        grant = running.codes.pop(form.get("code", ""), None)
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if grant is None or grant["code_challenge_method"] != "S256" or grant["code_challenge"] != challenge \
                or grant["client_id"] != form.get("client_id") or grant["redirect_uri"] != form.get("redirect_uri"):
            return JSONResponse({"error": "invalid_grant"}, status_code=400, headers=CORS)
        claims = {**running.login, **({"nonce": grant["nonce"]} if grant["nonce"] else {})}
        id_token = running.token(audience=grant["client_id"], **claims)
        return JSONResponse({"id_token": id_token, "token_type": "Bearer", "expires_in": 300}, headers=CORS)

    @app.get("/keys")
    def keys() -> dict[str, Any]:
        return running.jwks()

    with thread:
        yield running
