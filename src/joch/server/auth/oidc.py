"""OpenID Connect ID tokens as bearer tokens, verified as kube-apiserver's ``--oidc-*`` flags verify them.

A token is accepted when its signature verifies with a key of the issuer's JWKS, with an algorithm
of ``--oidc-signing-algs`` (RS256 by default: ``none`` and HMAC are never accepted, so a token
cannot be signed with the public key), its ``iss`` is ``--oidc-issuer-url`` exactly, its ``aud``
holds ``--oidc-client-id``, and ``exp``, ``nbf`` and ``iat`` hold with ``clock_skew_seconds`` of
leeway. The user name is the ``--oidc-username-claim`` (``sub`` by default) with
``--oidc-username-prefix`` in front; as in Kubernetes, the prefix defaults to ``ISSUER#`` unless
the claim is ``email`` (then none, and ``email_verified: false`` is refused), and ``-`` means none.
Groups come from ``--oidc-groups-claim`` (a string or a list of strings), each prefixed with
``--oidc-groups-prefix``.

Keys: the discovery document (``ISSUER/.well-known/openid-configuration``, whose ``issuer`` must be
the configured URL) names ``jwks_uri``; both are fetched on the first token, not at start-up (an
issuer that is down must not keep the API server down), and kept. A token signed with a key id the
cached set lacks triggers a refetch (the issuer rotated its keys), at most once per
``refetch_interval_seconds`` whatever the tokens say, so forged key ids cannot make the server
hammer the issuer. Fetches run in a worker thread; verifying with a cached key does not.
``--oidc-ca-file`` is the CA bundle the issuer's certificate is checked against (else the system's).

Why a token failed is logged at debug level without the token; the client always gets the same 401.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from typing import Any

import anyio.to_thread
import httpx
import jwt

from joch.api.identity import AUTHENTICATED, UserInfo
from joch.server.auth.options import OIDCOptions

logger = logging.getLogger("joch.server.auth")
DISCOVERY_PATH = "/.well-known/openid-configuration"
FETCH_TIMEOUT_SECONDS = 10.0


class FetchError(Exception):
    pass


def username_prefix(options: OIDCOptions) -> str:
    if options.username_prefix == "-":
        return ""
    if options.username_prefix is not None:
        return options.username_prefix
    return "" if options.username_claim == "email" else f"{options.issuer_url}#"


class OIDCAuthenticator:
    def __init__(self, options: OIDCOptions) -> None:
        self.options = options
        self._prefix = username_prefix(options)
        self._keys: list[jwt.PyJWK] = []
        self._fetched_at: float | None = None  # monotonic time of the last fetch attempt
        self._lock = threading.Lock()
        verify: ssl.SSLContext | bool = True
        if options.ca_file is not None:
            verify = ssl.create_default_context(cafile=str(options.ca_file))
        self._verify = verify

    async def authenticate(self, token: str) -> UserInfo | None:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return None  # not a JWT: some other authenticator's token, or garbage
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self.options.signing_algs:
            logger.debug("OIDC token refused: alg %r is not one of --oidc-signing-algs", alg)
            return None
        keys = self._candidates(kid)
        if not keys and self._may_fetch():
            await anyio.to_thread.run_sync(self.refresh)
            keys = self._candidates(kid)
        for key in keys:
            claims = self._verified(token, key)
            if claims is not None:
                return self._user(claims)
        if not keys:
            logger.debug("OIDC token refused: the issuer's keys have no key id %r", kid)
        return None

    def _candidates(self, kid: object) -> list[jwt.PyJWK]:
        return [k for k in self._keys if kid is None or k.key_id == kid]

    def _may_fetch(self) -> bool:
        fetched = self._fetched_at
        return fetched is None or time.monotonic() - fetched >= self.options.refetch_interval_seconds

    def refresh(self) -> None:
        """Fetch the discovery document and the JWKS (in a worker thread), unless another thread
        just did."""
        with self._lock:
            if not self._may_fetch():
                return
            self._fetched_at = time.monotonic()
            try:
                self._keys = self._fetch_keys()
            except FetchError as exc:
                logger.warning("cannot fetch the OIDC issuer's signing keys: %s (tokens signed with keys not "
                               "fetched before are refused until this works)", exc)

    def _fetch_keys(self) -> list[jwt.PyJWK]:
        issuer = self.options.issuer_url
        with httpx.Client(verify=self._verify, timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False) as http:
            config = _get_json(http, issuer.rstrip("/") + DISCOVERY_PATH)
            if config.get("issuer") != issuer:
                raise FetchError(f"the discovery document at {issuer}{DISCOVERY_PATH} names issuer "
                                 f"{config.get('issuer')!r}, not {issuer!r} (--oidc-issuer-url must match it exactly)")
            jwks_uri = config.get("jwks_uri")
            if not isinstance(jwks_uri, str) or not jwks_uri:
                raise FetchError(f"the discovery document at {issuer}{DISCOVERY_PATH} has no jwks_uri")
            jwks = _get_json(http, jwks_uri)
        try:
            return list(jwt.PyJWKSet.from_dict(jwks).keys)
        except jwt.PyJWTError as exc:
            raise FetchError(f"the JWKS at {jwks_uri} holds no usable key ({exc})") from None

    def _verified(self, token: str, key: jwt.PyJWK) -> dict[str, Any] | None:
        options = self.options
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key, algorithms=list(options.signing_algs), audience=options.client_id,
                issuer=options.issuer_url, leeway=options.clock_skew_seconds,
                options={"require": ["exp", "iss", "aud"], "verify_iat": True},
            )
        except jwt.PyJWTError as exc:
            logger.debug("OIDC token refused: %s", exc)
            return None
        return claims

    def _user(self, claims: dict[str, Any]) -> UserInfo | None:
        options = self.options
        name = claims.get(options.username_claim)
        if not isinstance(name, str) or not name:
            logger.debug("OIDC token refused: claim %r is not a non-empty string", options.username_claim)
            return None
        if options.username_claim == "email" and claims.get("email_verified", True) is not True:
            logger.debug("OIDC token refused: email_verified is not true")
            return None
        groups: list[str] = []
        if options.groups_claim:
            value = claims.get(options.groups_claim)
            if isinstance(value, str):
                groups = [value]
            elif isinstance(value, list) and all(isinstance(g, str) for g in value):
                groups = list(value)
            elif value is not None:
                logger.debug("OIDC token refused: claim %r is not a string or a list of strings",
                              options.groups_claim)
                return None
        return UserInfo(self._prefix + name, (*(options.groups_prefix + g for g in groups), AUTHENTICATED))


def _get_json(http: httpx.Client, url: str) -> dict[str, Any]:
    try:
        response = http.get(url, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise FetchError(f"GET {url} failed: {exc}") from None
    if response.status_code != 200:
        raise FetchError(f"GET {url} answered {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise FetchError(f"GET {url} did not answer JSON") from None
    if not isinstance(body, dict):
        raise FetchError(f"GET {url} did not answer a JSON object")
    return body
