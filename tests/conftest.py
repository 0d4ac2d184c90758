"""Shared fixtures: the ``store`` fixture runs every contract test on SQLite and on Postgres.

Postgres is the server named by ``JOCH_TEST_POSTGRES`` (the Makefile sets the local one). Each test
gets a schema of its own, dropped afterwards. In CI (``CI`` set) an unreachable Postgres is a
failure, never a skip: the Postgres half of the suite must run there.

``make test`` runs the suite on several pytest-xdist workers, a module at a time (``--dist loadfile``:
a module's tests run in order on one worker, so a module-scoped ``joch server`` starts once, and
``tests/e2e/test_governance.py``, whose last test reads what the others did, stays whole). Each worker
is a process of its own, so the tests share only what lies outside a process, and that is kept apart:
each test has its own ``tmp_path``, Postgres schema (its NOTIFY channel derives from it), ports
(``support/ports.py`` for server subprocesses) and ``JOCH_CONFIG``; nothing is written into the checkout.
(``--dist loadgroup`` would do nothing more here: pytest-xdist 3.8 tags a grouped test's ``_nodeid``,
which pytest 9 no longer reads, so groups are silently ignored.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from joch.store import Store, open_store

POSTGRES = os.environ.get("JOCH_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_reachable() -> str | None:
    try:
        with psycopg.connect(POSTGRES, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc)


@pytest.fixture(scope="session")
def postgres_available() -> None:
    problem = _postgres_reachable()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL at {POSTGRES} is required in CI: {problem}")
    pytest.skip(f"PostgreSQL at {POSTGRES} is not reachable: {problem}")


@pytest.fixture
def postgres_url(postgres_available: None) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped after the test."""
    schema = f"joch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in POSTGRES else "?"
    yield f"{POSTGRES}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'joch.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads contexts from JOCH_CONFIG (~/.config/joch/config.yaml by default): point it at
    a file that does not exist, so a developer's own contexts and tokens never reach a test."""
    monkeypatch.setenv("JOCH_CONFIG", str(tmp_path_factory.getbasetemp() / "no-joch-config.yaml"))
    monkeypatch.delenv("JOCH_TOKEN", raising=False)
