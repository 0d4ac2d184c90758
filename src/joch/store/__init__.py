"""The versioned object store: the contract in ``base``, one SQL implementation in ``sql`` shared by
the ``sqlite`` (embedded default) and ``postgres`` backends."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from joch.store.base import ListOptions, ListResult, Store, Watch, WatchEvent, WatchOptions, Writer
from joch.store.sealing import KeyRing

__all__ = ["KeyRing", "ListOptions", "ListResult", "Store", "Watch", "WatchEvent", "WatchOptions", "Writer",
           "default_url", "open_store"]


def default_url(data_dir: str | os.PathLike[str]) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'joch.db'}"


def open_store(
    url: str, *, history: int | None = 100_000, compact_interval: float = 30.0, secret_keys: KeyRing | None = None,
) -> Store:
    """Open the store named by ``url``: ``sqlite:///PATH[?synchronous=FULL]``,
    ``postgresql://USER@HOST:PORT/DB`` (any libpq URL) or ``kubernetes://[?kubeconfig=PATH&context=NAME]``
    (or just ``kubernetes``: custom resources on a Kubernetes API server; ``history``, ``compact_interval`` and
    ``secret_keys`` do not apply there: ``joch.store.kubernetes.store`` says what it cannot do).
    ``history`` bounds the change log: beyond its newest ``history`` changes it is compacted every
    ``compact_interval`` seconds (None keeps all). ``secret_keys`` encrypts Secret values at rest
    (``joch.store.sealing``); without it (tests and tools only — ``joch server`` always passes one)
    they are kept unencrypted, though still never in object rows or the change log. Opening a store
    whose Secrets need a key the ring does not have raises ``sealing.SecretKeyError`` naming it."""
    if url == "kubernetes" or url.startswith("kubernetes:"):  # custom resources (joch.store.kubernetes)
        from joch.store.kubernetes import KubernetesStore

        return KubernetesStore("kubernetes://" if url == "kubernetes" else url)
    from joch.store.sql import SqlStore

    if url.startswith(("postgresql://", "postgres://")):
        from joch.store.postgres import PostgresBackend

        return SqlStore(PostgresBackend(url), history=history, compact_interval=compact_interval, keys=secret_keys)
    if url.startswith("sqlite:"):
        parts = urlsplit(url)
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if path.startswith("//"):
            path = path[1:]
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        from joch.store.sqlite import SqliteBackend

        backend = SqliteBackend(Path(path), synchronous=options.get("synchronous", "NORMAL"))
        return SqlStore(backend, history=history, compact_interval=compact_interval, keys=secret_keys)
    raise ValueError(
        f"unsupported store URL {url!r}: use sqlite:///PATH/joch.db, postgresql://USER@HOST:PORT/DB or "
        "kubernetes://[?kubeconfig=PATH&context=NAME]"
    )
