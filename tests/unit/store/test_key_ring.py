"""The Secret key ring (``joch.store.sealing``): where ``joch server`` gets it, a generated key
file's mode, the file format, refusal of bad keys, and a ring that follows its file."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from joch.store.sealing import (
    KEY_FILE_NAME,
    KeyRing,
    Sealer,
    SecretKeyError,
    key_id,
    load_ring,
    new_key,
    write_key_file,
)

AAD = b"ops.joch.dev/Secret\0default\0db"


def test_the_server_generates_a_0600_key_file_once_and_uses_it_afterwards(tmp_path: Path) -> None:
    ring, note = load_ring(key_file=None, env_value=None, data_dir=tmp_path)
    path = tmp_path / KEY_FILE_NAME
    assert note is not None and str(path) in note
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, second_note = load_ring(key_file=None, env_value=None, data_dir=tmp_path)
    assert second_note is None and again.ids == ring.ids and len(ring.ids) == 1


def test_a_key_file_comes_before_the_environment_and_the_environment_before_the_data_dir(tmp_path: Path) -> None:
    file_key, env_key = new_key(), new_key()
    key_file = tmp_path / "ring"
    write_key_file(key_file, [file_key])
    env = base64.b64encode(env_key).decode()
    assert load_ring(key_file=key_file, env_value=env, data_dir=tmp_path)[0].ids == [key_id(file_key)]
    assert load_ring(key_file=None, env_value=env, data_dir=tmp_path)[0].ids == [key_id(env_key)]
    assert not (tmp_path / KEY_FILE_NAME).exists()
    with pytest.raises(SecretKeyError, match="does not exist"):
        load_ring(key_file=tmp_path / "missing", env_value=None, data_dir=tmp_path)


def test_a_ring_lists_keys_newest_first_and_decrypts_with_every_one(tmp_path: Path) -> None:
    old, new = new_key(), new_key()
    key_file = tmp_path / "ring"
    write_key_file(key_file, [new, old])
    text = key_file.read_text()
    assert text.startswith("#") and text.splitlines()[-2:] == [base64.b64encode(k).decode() for k in (new, old)]
    sealed_old = Sealer(KeyRing([old], source="old")).seal({"spec.data": {"k": "dg=="}}, AAD)
    ring = KeyRing.from_file(key_file)
    assert ring.primary.id == key_id(new) and ring.ids == [key_id(new), key_id(old)]
    assert Sealer(ring).open(sealed_old[1], AAD, what="x") == {"spec.data": {"k": "dg=="}}
    kid, envelope = Sealer(ring).seal({"spec.data": {}}, AAD)
    assert kid == key_id(new) and envelope.startswith(f"aes256gcm:{kid}:")
    with pytest.raises(SecretKeyError, match="does not decrypt"):
        Sealer(ring).open(envelope, b"another object", what="x")


def test_bad_keys_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SecretKeyError, match="entry 1 is not base64"):
        KeyRing.from_env("not a key!")
    with pytest.raises(SecretKeyError, match="entry 2 is 5 bytes"):
        KeyRing.from_env(base64.b64encode(new_key()).decode() + "," + base64.b64encode(b"short").decode())
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(SecretKeyError, match="holds no key"):
        KeyRing.from_file(empty)


def test_a_ring_rereads_its_file_when_it_changes(tmp_path: Path) -> None:
    old, new = new_key(), new_key()
    key_file = tmp_path / "ring"
    write_key_file(key_file, [old])
    ring = KeyRing.from_file(key_file)
    write_key_file(key_file, [new, old])  # what joch admin rotate-secret-key does
    os.utime(key_file, ns=(1, 1))  # a different mtime even on a coarse clock
    assert ring.has(key_id(new)) and ring.primary.id == key_id(new)
