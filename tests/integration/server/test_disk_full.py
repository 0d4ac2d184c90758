"""A full disk over HTTP: a write answers 507 ``InsufficientStorage`` naming the disk (not a 500),
``/readyz`` is 503 saying which disk is full (the store's or the runs'), and both recover by
themselves once space returns. Real tmpfs mounts, real servers."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from joch.runtime.local import LocalRuntime
from joch.server.app import create_app
from joch.server.testing import ServerThread, is_status
from joch.store import Store, open_store
from support import provider
from support.disks import fill, tmpfs


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", size="2m") as disk:
        yield disk


def test_a_full_store_disk_is_507_and_not_ready_until_space_returns(
        small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(f"sqlite:///{small_disk / 'joch.db'}")
    try:
        with ServerThread(create_app(store)) as server, httpx.Client(base_url=server.url) as client:
            url = "/apis/joch.dev/v1alpha1/namespaces/default/agentproviders"
            assert client.post(url, json=provider("before")).status_code == 201
            assert client.get("/readyz").status_code == 200
            ballast = fill(small_disk)

            big = provider("big")
            big["metadata"]["annotations"] = {"notes": "x" * 200_000}
            failed = client.post(url, json=big)
            assert failed.status_code == 507
            assert is_status(failed.json(), 507, "InsufficientStorage")
            assert "disk holding the store is full" in failed.json()["message"]
            assert str(small_disk / "joch.db") in failed.json()["message"]

            with caplog.at_level(logging.INFO, logger="joch.server"):
                for _ in range(3):
                    ready = client.get("/readyz")
                    assert ready.status_code == 503
                    assert is_status(ready.json(), 503, "ServiceUnavailable")
                    assert str(small_disk / "joch.db") in ready.json()["message"]
            said = [r.getMessage() for r in caplog.records if "not ready" in r.getMessage()]
            assert len(said) == 1, said  # logged when it changed, not at every probe

            ballast.unlink()
            assert client.get("/readyz").status_code == 200
            assert client.post(url, json=big).status_code == 201
    finally:
        store.close()


def test_a_full_runs_disk_makes_the_server_not_ready(tmp_path: Path, small_disk: Path, store: Store) -> None:
    runtime = LocalRuntime(small_disk / "data")
    try:
        with ServerThread(create_app(store, runtime=runtime)) as server, httpx.Client(base_url=server.url) as client:
            assert client.get("/readyz").status_code == 200
            ballast = fill(small_disk)
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert "the disk holding the runs' files is full" in ready.json()["message"]
            assert str(small_disk / "data") in ready.json()["message"]
            ballast.unlink()
            assert client.get("/readyz").status_code == 200
    finally:
        runtime.close()


class _FullDisk:
    """A store whose writes fail the way a file write on a full disk does (ENOSPC, unmapped)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in ("create", "transaction"):
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.ENOSPC, "No space left on device", "/var/lib/joch/some-file")
            return fail
        return getattr(self._store, name)


def test_an_unmapped_enospc_is_507_naming_the_file(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(_FullDisk(store))  # type: ignore[arg-type]
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as client:
        answer = client.post("/apis/joch.dev/v1alpha1/namespaces/default/agentproviders", json=provider("p"))
    assert answer.status_code == 507
    assert is_status(answer.json(), 507, "InsufficientStorage")
    assert "/var/lib/joch/some-file" in answer.json()["message"]
    assert not any(r.exc_info for r in caplog.records)  # an operator's problem, not a traceback
