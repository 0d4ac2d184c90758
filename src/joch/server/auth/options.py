"""How the server authenticates: the ``joch server`` flags, checked before the server starts.

The flags are kube-apiserver's (``--token-file``, ``--oidc-issuer-url``, ``--oidc-client-id``,
``--oidc-username-claim``, ``--oidc-username-prefix``, ``--oidc-groups-claim``,
``--oidc-groups-prefix``, ``--oidc-ca-file``, ``--oidc-signing-algs``) with the same meanings and
defaults. With neither a token file nor an issuer the server runs with "auth none": every caller is
``system:anonymous`` and every request is allowed, which ``check_exposure`` permits only on a
loopback address.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from joch.api import errors

DEFAULT_SIGNING_ALGS = ("RS256",)
SUPPORTED_SIGNING_ALGS = frozenset({"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"})


@dataclass(frozen=True)
class OIDCOptions:
    issuer_url: str
    client_id: str
    username_claim: str = "sub"
    username_prefix: str | None = None  # None: kube-apiserver's default (see ``oidc.username_prefix``)
    groups_claim: str | None = None
    groups_prefix: str = ""
    ca_file: Path | None = None
    signing_algs: tuple[str, ...] = DEFAULT_SIGNING_ALGS
    clock_skew_seconds: float = 60.0
    refetch_interval_seconds: float = 10.0  # at most one JWKS refetch for an unknown key per interval


@dataclass(frozen=True)
class AuthOptions:
    """``token_file`` and ``oidc`` are the authenticators (either, both, or neither: auth none).
    ``token_file_check_seconds``: how often the token file's ``stat`` is compared to the one read;
    ``binding_cache_seconds``: how long RoleBindings read from the store are trusted to grant access
    (a denial always re-reads them when the store changed, so a new binding works at once; a deleted
    one stops granting within this time)."""

    token_file: Path | None = None
    oidc: OIDCOptions | None = None
    token_file_check_seconds: float = 1.0
    binding_cache_seconds: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.token_file is not None or self.oidc is not None


HOW_TO_CONFIGURE = (
    "give the server an authenticator: --token-file FILE (lines of token,user,uid,\"group1,group2\"; "
    "a user in group system:masters is admin everywhere) or --oidc-issuer-url URL --oidc-client-id ID; "
    "or listen on 127.0.0.1 (the default --host) and reach it through an SSH tunnel"
)


def check_exposure(host: str, options: AuthOptions) -> None:
    """A server on a non-loopback address without an authenticator would let anyone who can connect
    run commands as this user: refuse to start, saying how to configure one."""
    from joch.server import guard

    if options.enabled or guard.is_loopback(host):
        return
    where = "every address of this machine" if guard.is_wildcard(host) else host
    raise errors.BadRequest(f"refusing to listen on {where} ({host}) without authentication: anyone who can reach "
                            f"it could create agent runs and so run commands on this machine; {HOW_TO_CONFIGURE}")


def oidc_options(
    *, issuer_url: str | None, client_id: str | None, username_claim: str = "sub", username_prefix: str | None = None,
    groups_claim: str | None = None, groups_prefix: str | None = None, ca_file: Path | None = None,
    signing_algs: str | None = None,
) -> OIDCOptions | None:
    """The ``--oidc-*`` flags, checked: an issuer needs a client id (the audience), and so on."""
    given = {"--oidc-client-id": client_id, "--oidc-groups-claim": groups_claim,
             "--oidc-ca-file": ca_file, "--oidc-username-prefix": username_prefix,
             "--oidc-groups-prefix": groups_prefix, "--oidc-signing-algs": signing_algs}
    if not issuer_url:
        extra = [flag for flag, value in given.items() if value]
        if extra:
            raise errors.BadRequest(f"{', '.join(extra)} given without --oidc-issuer-url: add the issuer's URL "
                                    "(https://issuer.example.com) or drop them")
        return None
    if not issuer_url.startswith("https://") and not issuer_url.startswith("http://127.0.0.1") \
            and not issuer_url.startswith("http://localhost"):
        raise errors.BadRequest(f'--oidc-issuer-url "{issuer_url}" must be an https:// URL (the issuer\'s "iss")')
    if not client_id:
        raise errors.BadRequest("--oidc-issuer-url needs --oidc-client-id: the audience (\"aud\") tokens are issued "
                                "for")
    if ca_file is not None and not ca_file.is_file():
        raise errors.BadRequest(f'--oidc-ca-file "{ca_file}" is not a readable file: give the PEM file of the CA '
                                "that signed the issuer's certificate")
    algs = tuple(a.strip() for a in (signing_algs or ",".join(DEFAULT_SIGNING_ALGS)).split(",") if a.strip())
    unknown = [a for a in algs if a not in SUPPORTED_SIGNING_ALGS]
    if unknown or not algs:
        raise errors.BadRequest(f"--oidc-signing-algs: {', '.join(unknown) or 'none given'} not supported; "
                                f"use a comma-separated list of {', '.join(sorted(SUPPORTED_SIGNING_ALGS))}")
    return OIDCOptions(issuer_url=issuer_url, client_id=client_id, username_claim=username_claim or "sub",
                       username_prefix=username_prefix, groups_claim=groups_claim or None,
                       groups_prefix=groups_prefix or "", ca_file=ca_file, signing_algs=algs)
