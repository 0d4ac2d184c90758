"""Audit retention: a background thread that deletes audit rows older than ``--audit-retention``.

``joch server`` starts one ``AuditPruner`` (both backends): it prunes once at start, then every
``interval`` seconds (an hour), until stopped. Pruning is the only way audit rows are deleted (the
API has no such route). It runs on its own thread, and the store deletes in batches of a few
thousand rows per transaction (``Store.prune_audit``), so requests never wait on it for long. A
failed prune (a database restarting) is logged and tried again at the next interval; it never
stops the server. A retention of 0 keeps every row: no thread is started.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

from joch.store.base import Store

logger = logging.getLogger("joch.server.retention")
PRUNE_INTERVAL = 3600.0


class AuditPruner:
    def __init__(self, store: Store, retention: float, *, interval: float = PRUNE_INTERVAL) -> None:
        self.store = store
        self.retention = retention
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="joch-audit-retention", daemon=True)

    def start(self) -> AuditPruner:
        if self.retention > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def prune_once(self) -> int:
        before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.retention)
        pruned = self.store.prune_audit(before)
        if pruned:
            logger.info("audit retention: deleted %d audit rows older than %s", pruned,
                        before.strftime("%Y-%m-%dT%H:%M:%SZ"))
        return pruned

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.prune_once()
            except Exception:  # a failed prune waits for the next interval
                logger.warning("audit retention: pruning failed; trying again in %.0f s", self.interval,
                               exc_info=True)
            self._stop.wait(self.interval)

    def __enter__(self) -> AuditPruner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
