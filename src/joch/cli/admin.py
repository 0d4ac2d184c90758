"""``joch admin``: operations on the store itself, run next to (or instead of) a server.

``joch admin rotate-secret-key [--secret-key-file F] [--store URL]`` rotates the key Secrets are
encrypted with (``joch.store.sealing``):

1. it opens the store with the current ring — the file, else ``JOCH_SECRET_KEY`` — so a ring that
   cannot decrypt the store is refused before anything changes;
2. generates a new key and writes the ring file with it first and every old key after it
   (mode 0600, atomically). From here on every key the store needs is in the file, so a crash at
   any later point loses nothing;
3. re-encrypts every Secret not yet under the new key in one transaction (both backends; writers
   wait for it), and says how many it re-encrypted.

A running server that reads the same file picks up the new ring by itself (the ring re-reads its
file when it changed). Several replicas: each must have the new ring before it meets a Secret
sealed with the new key — copy the new file to every replica (or share it) right after the
command, then restart the replicas that got the ring from ``JOCH_SECRET_KEY``. Until a replica has
it, runs it starts that need a Secret fail to resolve it (the error names the missing key id).
Remove an old key from the file only once ``rotate-secret-key`` (or a later one) has re-encrypted
everything: a store still holding values under a removed key refuses to open, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

from joch.api import errors
from joch.store import open_store, sealing
from joch.store.sealing import KeyRing
from joch.store.sql import SqlStore


def rotate_secret_key(*, key_file: Path | None, store_url: str, data_dir: Path) -> str:
    """Rotate and re-encrypt (module docstring); the sentence to print."""
    path = Path(key_file) if key_file is not None else Path(data_dir) / sealing.KEY_FILE_NAME
    env_value = os.environ.get(sealing.ENV)
    if path.exists():
        old = KeyRing.from_file(path)
    elif env_value:
        old = KeyRing.from_env(env_value)
    else:
        raise errors.BadRequest(
            f'no Secret key ring to rotate: "{path}" does not exist and {sealing.ENV} is not set; give '
            "--secret-key-file FILE (the file the server uses) or --data-dir DIR (its DATA_DIR/secret.key)")
    store = open_store(store_url, history=None, secret_keys=old)  # refuses a ring that cannot decrypt it
    store.close()
    material = sealing.new_key()
    keys = [material, *(key.material for key in old.keys)]
    sealing.write_key_file(path, keys)
    ring = KeyRing.from_file(path)
    store = open_store(store_url, history=None, secret_keys=ring)
    try:
        if not isinstance(store, SqlStore):
            raise errors.BadRequest(f"the store at {store_url} cannot re-encrypt its Secrets")
        count = store.reseal(rotate=True)
    finally:
        store.close()
    noun = "Secret" if count == 1 else "Secrets"
    return (f'new key {sealing.key_id(material)} written first to "{path}" ({len(keys)} keys, newest first); '
            f"re-encrypted {count} {noun} with it. Give every other replica this file before it serves them.")


__all__ = ["rotate_secret_key"]
