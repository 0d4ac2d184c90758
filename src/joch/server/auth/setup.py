"""Wiring authentication and authorization into an app (``create_app`` calls ``install``)."""

from __future__ import annotations

from fastapi import FastAPI

from joch.api.identity import UserInfo
from joch.server.auth import middleware, oidc, rbac, reviews, tokenfile
from joch.server.options import ServerOptions
from joch.store.base import Store


def install(app: FastAPI, store: Store, options: ServerOptions) -> None:
    """Add the routes and the middleware (call after the other middleware's inner layers, before
    ``guard.Guard``: the last ``add_middleware`` is the outermost)."""
    auth = options.auth
    authenticators: list[middleware.TokenAuthenticator] = []
    if auth.token_file is not None:
        authenticators.append(_Sync(tokenfile.TokenFile(auth.token_file, check_seconds=auth.token_file_check_seconds)))
    if auth.oidc is not None:
        authenticators.append(oidc.OIDCAuthenticator(auth.oidc))
    authorizer: rbac.Authorizer = (rbac.RBAC(store, cache_seconds=auth.binding_cache_seconds) if authenticators
                                   else rbac.AlwaysAllow())
    app.state.authorizer = authorizer
    reviews.install(app, options)
    app.add_middleware(middleware.AuthMiddleware, store=store,
                       authenticator=middleware.Authenticators(authenticators) if authenticators else None,
                       authorizer=authorizer)


class _Sync:
    """A token file's lookup (a dict get) as the async authenticator the middleware awaits."""

    def __init__(self, tokens: tokenfile.TokenFile) -> None:
        self.tokens = tokens

    async def authenticate(self, token: str) -> UserInfo | None:
        return self.tokens.authenticate(token)
