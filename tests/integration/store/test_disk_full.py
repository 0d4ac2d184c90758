"""A full disk under the store: writes fail with ``InsufficientStorage`` naming the disk (not a
driver error that becomes a 500), readiness says so, and writes resume once space returns — on
SQLite (its file on a small tmpfs) and on Postgres (a tablespace on a small tmpfs)."""

from __future__ import annotations

import base64
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from joch.api import errors
from joch.api.kinds import AGENT
from joch.store import Store, open_store
from support.disks import fill, tmpfs

POSTGRES = os.environ.get("JOCH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def agent(name: str, padding: int = 0) -> dict[str, Any]:
    # Random bytes in base64 do not compress, so TOAST cannot squeeze a padded object into old pages.
    notes = {"notes": base64.b64encode(os.urandom(padding)).decode()} if padding else {}
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "default", "annotations": notes},
            "spec": {"providerRef": {"name": "p"}}}


@pytest.fixture
def sqlite_on_small_disk(tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    with tmpfs(tmp_path / "disk", size="2m") as disk:
        store = open_store(f"sqlite:///{disk / 'joch.db'}")
        try:
            yield store, disk
        finally:
            store.close()


@pytest.fixture
def postgres_on_small_disk(postgres_available: None) -> Iterator[tuple[Store, Path]]:
    name = f"joch_test_{uuid.uuid4().hex[:12]}"
    # Not below tmp_path: the database server's user must be able to reach the directory.
    place = Path(tempfile.gettempdir()) / name
    with tmpfs(place, size="2m", owner="postgres:postgres") as disk, \
            psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f"CREATE TABLESPACE {name} LOCATION '{disk}'")
        admin.execute(f'CREATE SCHEMA "{name}"')
        sep = "&" if "?" in POSTGRES else "?"
        store = open_store(f"{POSTGRES}{sep}options={quote(f'-csearch_path={name} -cdefault_tablespace={name}')}")
        try:
            yield store, disk
        finally:
            store.close()
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')
            admin.execute(f"DROP TABLESPACE {name}")
    place.rmdir()


def test_sqlite_full_disk_is_insufficient_storage_and_writes_resume(
        sqlite_on_small_disk: tuple[Store, Path]) -> None:
    store, disk = sqlite_on_small_disk
    store.create(AGENT, agent("before"))
    assert store.storage_problem() is None
    ballast = fill(disk)

    with pytest.raises(errors.InsufficientStorage) as raised:
        store.create(AGENT, agent("big", padding=64 * 1024))
    assert raised.value.code == 507
    assert "disk holding the store is full" in raised.value.message
    assert str(disk / "joch.db") in raised.value.message
    problem = store.storage_problem()
    assert problem is not None and str(disk / "joch.db") in problem
    assert store.get(AGENT, "default", "before")["metadata"]["name"] == "before"  # reads still work

    ballast.unlink()
    assert store.storage_problem() is None
    assert store.create(AGENT, agent("after", padding=64 * 1024))["metadata"]["name"] == "after"
    with pytest.raises(errors.NotFound):
        store.get(AGENT, "default", "big")  # the failed write left nothing behind


@pytest.mark.postgres
def test_postgres_full_disk_is_insufficient_storage_and_writes_resume(
        postgres_on_small_disk: tuple[Store, Path]) -> None:
    store, disk = postgres_on_small_disk
    store.create(AGENT, agent("before"))
    ballast = fill(disk)

    with pytest.raises(errors.InsufficientStorage) as raised:
        for i in range(20):  # until a write needs a new page in the full tablespace
            store.create(AGENT, agent(f"big-{i}", padding=64 * 1024))
    assert raised.value.code == 507
    assert "disk of the PostgreSQL server" in raised.value.message
    assert "No space left on device" in raised.value.message

    ballast.unlink()
    assert store.storage_problem() is None
    assert store.create(AGENT, agent("after", padding=64 * 1024))["metadata"]["name"] == "after"
