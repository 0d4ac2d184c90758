"""How a server is configured: one frozen ``ServerOptions`` handed to ``create_app``.

Everything tunable lives here so route modules take one object and tests can build a server with a
short bookmark interval or the other watch-expiry mode without monkeypatching.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from joch import __version__
from joch.admission.validation import AdmissionOptions
from joch.server.auth.options import AuthOptions

MiB = 1024 * 1024


KUBERNETES_API = (1, 37)
"""The Kubernetes API level Joch's server speaks (the newest kubectl it is tested with)."""


@dataclass(frozen=True)
class VersionInfo:
    """What ``GET /version`` reports, in the shape of Kubernetes' ``version.Info``.

    ``major``, ``minor`` and ``gitVersion`` carry the Kubernetes API level (``KUBERNETES_API``),
    with Joch's own version as semver build metadata (``v1.37.0+joch.0.1.0``): kubectl compares the
    server's gitVersion with its own and warns when the minor versions are more than one apart, and
    clients pick wire features by it, so it must say what the API is, not which Joch serves it.
    Joch's version is also ``jochVersion`` (``v0.1.0``), which ``joch version`` prints."""

    major: str
    minor: str
    git_version: str
    git_commit: str = ""
    build_date: str = ""
    joch_version: str = f"v{__version__}"

    @classmethod
    def current(cls) -> VersionInfo:
        major, minor = KUBERNETES_API
        metadata = ".".join(p for p in re.split(r"[^0-9A-Za-z-]+", __version__) if p)
        return cls(major=str(major), minor=str(minor), git_version=f"v{major}.{minor}.0+joch.{metadata}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "major": self.major,
            "minor": self.minor,
            "jochVersion": self.joch_version,
            "gitVersion": self.git_version,
            "gitCommit": self.git_commit,
            "gitTreeState": "clean" if self.git_commit else "",
            "buildDate": self.build_date,
            "goVersion": f"python{sys.version_info.major}.{sys.version_info.minor}",
            "compiler": platform.python_implementation().lower(),
            "platform": f"{sys.platform}/{platform.machine().lower()}",
        }


@dataclass(frozen=True)
class ServerOptions:
    """``watch_expired`` picks what a watch from a compacted resourceVersion gets (see
    ``joch.server.watch``): ``"event"`` (Kubernetes: a 200 stream whose only event is an ERROR
    carrying a 410 ``Expired`` Status) or ``"status"`` (a plain 410 Status before any streaming).

    ``bind_host`` (the address the server listens on; ``serve`` sets it), ``allowed_hosts`` and
    ``allowed_origins`` configure ``joch.server.guard``: which ``Host`` names are answered besides
    ``localhost``, IP addresses and the bind host (``*``: any), and which web origins may use the
    API from a browser.

    Limits (``joch.server.limits``): ``max_watches`` open watch streams at once, past which a watch
    is a 429 (None: derived from the open-file limit); ``watch_buffer_events`` and
    ``watch_buffer_bytes`` unread by one watcher, past which it is ended with a 410 (see
    ``joch.store.feed``); ``max_apply_documents`` objects and ``max_apply_bytes`` of body in one
    ``/v1/resources/apply`` or ``create``, which is one write transaction (413 past either).

    ``auth``: the authenticators (token file, OIDC; neither: auth none) and the caches of
    ``joch.server.auth``.
    ``audit_retention``: seconds an audit row is kept (``joch.server.retention``; 0 keeps every row).
    ``metrics_public``: ``/metrics`` is readable without a token (``joch.server.metrics``).
    """

    admission: AdmissionOptions = field(default_factory=AdmissionOptions)
    bookmark_interval: float = 60.0
    sse_heartbeat_interval: float = 15.0
    watch_expired: Literal["event", "status"] = "event"
    max_body_bytes: int = 3 * MiB
    max_apply_bytes: int = 16 * MiB  # about half a second of admission and writes under the lock
    max_apply_documents: int = 1000   # likewise (an apply validates and writes inside its transaction)
    max_watches: int | None = None
    watch_buffer_events: int = 10_000
    watch_buffer_bytes: int = 32 * MiB
    version: VersionInfo = field(default_factory=VersionInfo.current)
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    auth: AuthOptions = field(default_factory=AuthOptions)
    audit_retention: float = 90 * 86400.0
    metrics_public: bool = False
