"""Secret values at rest (``joch.store.sealing``), on SQLite and Postgres: only ciphertext in the
database (the raw SQLite file with its -wal and -shm, every Postgres table), a round trip through
``reveal``, rotation to a new key, a wrong key refused at open naming the key it needs, and the
plain-text values an older joch left sealed at the next start."""

from __future__ import annotations

import base64
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from integration.store.test_change_history import _apply_migrations_up_to, agent, change_rows
from joch.api.kinds import AGENT, SECRET
from joch.api.namespaces import NAMESPACE
from joch.store import KeyRing, Store, open_store
from joch.store.sealing import SecretKeyError, key_id, new_key, write_key_file
from joch.store.sql import SqlStore

VALUE = "pw-8675309-at-rest"
ENCODED = base64.b64encode(VALUE.encode()).decode()


def secret(name: str = "db", value: str = ENCODED, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "default", **meta},
            "spec": {"type": "Opaque", "data": {"token": value}}}


def ring(*keys: bytes, source: str = "test ring") -> KeyRing:
    return KeyRing(list(keys), source=source)


def raw_database(store_url: str) -> bytes:
    """Everything the database holds, read past the store: the SQLite files byte for byte, or every
    row of every table of the test's Postgres schema as text."""
    if store_url.startswith("sqlite:"):
        path = Path(urlsplit(store_url).path)
        return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
    out = []
    with psycopg.connect(store_url) as pg:
        tables = [r[0] for r in pg.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()]
        assert "joch_sealed" in tables and "joch_objects" in tables
        for table in tables:
            out += [repr(row) for row in pg.execute(f"SELECT * FROM {table}").fetchall()]
    return "\n".join(out).encode()


def sealed_rows(store_url: str) -> list[tuple[str, str, str]]:
    sql = "SELECT name, key_id, value FROM joch_sealed ORDER BY name"
    if store_url.startswith("sqlite:"):
        with closing(sqlite3.connect(urlsplit(store_url).path)) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]  # type: ignore[misc]
    with psycopg.connect(store_url) as pg:
        return [tuple(r) for r in pg.execute(sql).fetchall()]  # type: ignore[misc]


def assert_absent(store_url: str) -> None:
    raw = raw_database(store_url)
    assert VALUE.encode() not in raw and ENCODED.encode() not in raw


def test_only_ciphertext_reaches_the_database_and_reveal_gives_the_value(store_url: str) -> None:
    key = new_key()
    s = open_store(store_url, secret_keys=ring(key))
    try:
        created = s.create(SECRET, secret())
        assert "data" not in created["spec"] and created["status"]["keys"] == [{"name": "token", "size": len(VALUE)}]
        assert s.get(SECRET, "default", "db") == created
        assert s.list(SECRET).items == [created]
        assert s.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": ENCODED}
        s.create(AGENT, agent("a"))
        assert s.reveal(AGENT, "default", "a") == s.get(AGENT, "default", "a")  # nothing sealed: get
        # An update without data keeps the values; with data it replaces them; both stay sealed.
        kept = s.update(SECRET, {**created, "metadata": {**created["metadata"], "labels": {"team": "x"}}})
        assert s.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": ENCODED}
        assert kept["metadata"]["generation"] == 1  # labels are not spec
        other = base64.b64encode(b"second-value-42").decode()
        changed = s.update(SECRET, {**kept, "spec": {"type": "Opaque", "data": {"token": other}}})
        assert changed["metadata"]["generation"] == 2 and "data" not in changed["spec"]
        assert s.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": other}
        again = s.update(SECRET, {**changed, "spec": {"type": "Opaque", "data": {"token": other}}})
        assert again["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]  # equal: no write
        s.update(SECRET, {**again, "spec": {"type": "Opaque", "data": {"token": ENCODED}}})
        with s.transaction() as tx:
            assert tx.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": ENCODED}
    finally:
        s.close()
    [(name, kid, value)] = sealed_rows(store_url)
    assert name == "db" and kid == key_id(key) and value.startswith(f"aes256gcm:{kid}:")
    assert_absent(store_url)
    assert not [body for *_, body in change_rows(store_url) if "data" in json.loads(body).get("spec", {})]

    s = open_store(store_url, secret_keys=ring(key))
    try:
        s.delete(SECRET, "default", "db")
        assert sealed_rows(store_url) == []
    finally:
        s.close()


def test_a_store_opened_with_the_wrong_key_says_so_at_open(store_url: str, tmp_path: Path) -> None:
    right, wrong = new_key(), new_key()
    s = open_store(store_url, secret_keys=ring(right))
    s.create(SECRET, secret())
    s.close()
    key_file = tmp_path / "secret.key"
    write_key_file(key_file, [wrong])
    with pytest.raises(SecretKeyError) as info:
        open_store(store_url, secret_keys=KeyRing.from_file(key_file))
    assert f'secret key file "{key_file}"' in info.value.message
    assert key_id(right) in info.value.message and key_id(wrong) in info.value.message
    with pytest.raises(SecretKeyError) as keyless:
        open_store(store_url)
    assert key_id(right) in keyless.value.message and "--secret-key-file" in keyless.value.message
    # A ring with the right key among others opens it.
    open_store(store_url, secret_keys=ring(wrong, right)).close()


def test_rotation_reencrypts_every_secret_with_the_new_key(store_url: str) -> None:
    old, new = new_key(), new_key()
    s = open_store(store_url, secret_keys=ring(old))
    for name in ("a", "b", "c"):
        s.create(SECRET, secret(name))
    s.close()
    s = open_store(store_url, secret_keys=ring(new, old))
    try:
        assert isinstance(s, SqlStore)
        before = s.current_revision()
        # New writes use the first key at once; rotation re-encrypts the rest and counts them.
        s.create(SECRET, secret("d"))
        assert s.sealed_key_ids() == {key_id(old): 3, key_id(new): 1}
        assert s.reseal() == 3
        assert s.sealed_key_ids() == {key_id(new): 4}
        assert s.reseal() == 0
        assert s.current_revision() == before + 1  # re-encrypting is not a change a watcher sees
    finally:
        s.close()
    s = open_store(store_url, secret_keys=ring(new))  # the old key is no longer needed
    try:
        assert [s.reveal(SECRET, "default", n)["spec"]["data"] for n in "abcd"] == [{"token": ENCODED}] * 4
    finally:
        s.close()
    with pytest.raises(SecretKeyError, match=key_id(new)):
        open_store(store_url, secret_keys=ring(old))
    assert_absent(store_url)


def test_plain_text_values_of_an_older_joch_are_sealed_at_start(store_url: str) -> None:
    run = _apply_migrations_up_to(store_url, 3)
    body = json.dumps(secret("kept"))
    run("INSERT INTO joch_changes (revision, kind, namespace, name, type, body) VALUES (1, ?, 'default', 'kept', "
        "'ADDED', ?)", (SECRET.key, body))
    run("INSERT INTO joch_objects (kind, namespace, name, uid, revision, body) "
        "VALUES (?, 'default', 'kept', 'u', 1, ?)", (SECRET.key, body))
    run("UPDATE joch_meta SET value = 1 WHERE key = 'revision'")
    if store_url.startswith("sqlite:"):
        assert VALUE.encode() not in raw_database(store_url)  # base64 only
        assert ENCODED.encode() in raw_database(store_url)  # the test starts from plain text
    key = new_key()
    s = open_store(store_url, secret_keys=ring(key))
    try:
        assert s.reveal(SECRET, "default", "kept")["spec"]["data"] == {"token": ENCODED}
        shown = s.get(SECRET, "default", "kept")
        assert "data" not in shown["spec"] and shown["status"]["keys"] == [{"name": "token", "size": len(VALUE)}]
        # sealing is not a change (opening added only the Namespaces default and joch-system)
        assert s.current_revision() == 1 + len(s.list(NAMESPACE).items)
        # While the store is open, too (SQLite: freed space zeroed, then the WAL checkpointed into
        # the main file, which otherwise keeps the old pages until the last connection closes).
        assert_absent(store_url)
    finally:
        s.close()
    assert [(n, k) for n, k, _ in sealed_rows(store_url)] == [("kept", key_id(key))]
    assert_absent(store_url)  # SQLite: freed space zeroed and the WAL truncated, not only the rows rewritten


def test_a_keyless_store_keeps_values_out_of_rows_and_a_ring_encrypts_them_later(store_url: str) -> None:
    s = open_store(store_url)
    s.create(SECRET, secret())
    assert s.reveal(SECRET, "default", "db")["spec"]["data"] == {"token": ENCODED}
    s.close()
    assert [k for _, k, _ in sealed_rows(store_url)] == ["identity"]
    assert not [body for *_, body in change_rows(store_url) if ENCODED in body]
    key = new_key()
    open_store(store_url, secret_keys=ring(key)).close()
    assert [k for _, k, _ in sealed_rows(store_url)] == [key_id(key)]
    assert_absent(store_url)


def test_a_sealed_value_does_not_open_as_another_objects(store_url: str) -> None:
    key = new_key()
    s: Store = open_store(store_url, secret_keys=ring(key))
    s.create(SECRET, secret("a"))
    s.create(SECRET, secret("b", base64.b64encode(b"bbb").decode()))
    s.close()
    # Someone with write access to the database copies a's ciphertext onto b.
    [(_, _, a_value), _] = sealed_rows(store_url)
    if store_url.startswith("sqlite:"):
        with closing(sqlite3.connect(urlsplit(store_url).path)) as conn, conn:
            conn.execute("UPDATE joch_sealed SET value = ? WHERE name = 'b'", (a_value,))
    else:
        with psycopg.connect(store_url) as pg:
            pg.execute("UPDATE joch_sealed SET value = %s WHERE name = 'b'", (a_value,))
    # Refused at open (which decrypts one value per key, and may pick b's) or when b is read.
    with pytest.raises(SecretKeyError, match='"b"'):
        s = open_store(store_url, secret_keys=ring(key))
        try:
            s.reveal(SECRET, "default", "b")
        finally:
            s.close()


def test_kubectls_last_applied_annotation_keeps_no_value(store_url: str) -> None:
    annotation = "kubectl.kubernetes.io/last-applied-configuration"
    manifest = {**secret(), "spec": {"stringData": {"token": VALUE}, "data": {"other": ENCODED}}}
    s = open_store(store_url, secret_keys=ring(new_key()))
    try:
        created = s.create(SECRET, secret(annotations={annotation: json.dumps(manifest)}))
        kept = json.loads(created["metadata"]["annotations"][annotation])
        assert kept["metadata"]["name"] == "db" and kept["spec"] == {}
        # kubectl apply of a changed value: the annotation again holds it, the store again drops it.
        changed = {**secret(value=base64.b64encode(b"changed").decode()), "metadata": {
            **created["metadata"], "annotations": {annotation: json.dumps(manifest)}}}
        updated = s.update(SECRET, changed)
        assert updated["metadata"]["generation"] == 2 and "stringData" not in json.dumps(updated)
        assert s.get(SECRET, "default", "db") == updated
    finally:
        s.close()
    assert_absent(store_url)


def test_joch_admin_rotate_secret_key_on_either_store(store_url: str, tmp_path: Path) -> None:
    from joch.cli.admin import rotate_secret_key

    old = new_key()
    key_file = tmp_path / "ring.key"
    write_key_file(key_file, [old])
    s = open_store(store_url, secret_keys=KeyRing.from_file(key_file))
    for name in ("a", "b"):
        s.create(SECRET, secret(name))
    s.close()
    said = rotate_secret_key(key_file=key_file, store_url=store_url, data_dir=tmp_path / "unused")
    rotated = KeyRing.from_file(key_file)
    assert rotated.ids[1:] == [key_id(old)] and f"new key {rotated.ids[0]}" in said
    assert "re-encrypted 2 Secrets" in said and str(key_file) in said
    assert {k for _, k, _ in sealed_rows(store_url)} == {rotated.ids[0]}
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    # A ring that cannot open the store is refused before the file changes.
    stranger = tmp_path / "stranger.key"
    write_key_file(stranger, [new_key()])
    before = stranger.read_text()
    with pytest.raises(SecretKeyError, match=rotated.ids[0]):
        rotate_secret_key(key_file=stranger, store_url=store_url, data_dir=tmp_path)
    assert stranger.read_text() == before
