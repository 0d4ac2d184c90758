"""Encryption at rest of sensitive fields (a Secret's ``spec.data``): the key ring and the cipher.

Like Kubernetes' ``EncryptionConfiguration``, it is the store that encrypts, so no table, change-log
row or SQLite WAL frame ever holds a value in plain text: the object row and the change log keep
the public view (``joch.api.secrets``), and the values go, sealed, into ``joch_sealed`` (one row per
object, written in the same transaction).

* **Cipher: AES-256-GCM** (``cryptography``'s ``AESGCM``), rather than Fernet: a 256-bit key (Fernet
  is AES-128-CBC + HMAC), one authenticated primitive instead of two, and associated data — each
  ciphertext is bound to the object it belongs to (kind, namespace, name), so a row copied onto
  another Secret does not decrypt. Nonces are 96 random bits, far below GCM's limit for the number
  of Secret writes one key sees. Fernet's ``MultiFernet`` gives rotation, but its tokens do not name
  their key; ours do, which is what makes the wrong-key check at open exact.
* **Envelope:** ``aes256gcm:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>``. The key id is the first 8
  bytes of ``sha256("joch-secret-key-id\\0" ‖ key)`` in hex: it names a key without revealing it,
  and a ring that has a key of that id has *that* key.
* **Key ring:** keys newest first; the first encrypts, every key decrypts. A key file holds one
  base64-encoded 32-byte key per line (``#`` comments and blank lines ignored); ``JOCH_SECRET_KEY``
  holds the same, separated by commas. A ring read from a file re-reads it when the file changed
  (``joch admin rotate-secret-key`` rewrites it), so a running server picks up a rotation.
* **No ring** (``KeyRing`` None, tests and tools only): values are kept under the ``identity`` key id,
  unencrypted, still outside the object rows and the change log. ``joch server`` always has a ring.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets as random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from joch.api import errors

CIPHER = "aes256gcm"
IDENTITY = "identity"
KEY_BYTES = 32
NONCE_BYTES = 12
ENV = "JOCH_SECRET_KEY"
KEY_FILE_NAME = "secret.key"
_HEADER = ("# Joch Secret encryption keys, newest first: the first encrypts, every one decrypts.\n"
           "# Keep this file (mode 0600) and back it up: without its keys the Secrets in the store are lost.\n")


class SecretKeyError(errors.ServiceUnavailable):
    """The key ring cannot decrypt what the store holds, or a key source is unusable."""


@dataclass(frozen=True)
class Key:
    id: str
    material: bytes

    @classmethod
    def of(cls, material: bytes) -> Key:
        return cls(key_id(material), material)


def key_id(material: bytes) -> str:
    return hashlib.sha256(b"joch-secret-key-id\0" + material).digest()[:8].hex()


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def encode_key(material: bytes) -> str:
    return base64.b64encode(material).decode()


def parse_keys(text: str, source: str) -> list[bytes]:
    """The keys in a key file's text or ``JOCH_SECRET_KEY`` (commas or lines), newest first."""
    keys: list[bytes] = []
    entries = [entry.strip() for line in text.splitlines() if not line.strip().startswith("#")
               for entry in line.split(",")]
    for number, entry in enumerate((e for e in entries if e), start=1):
        try:
            material = base64.b64decode(entry, validate=True)
        except (binascii.Error, ValueError):
            raise SecretKeyError(f"{source}: entry {number} is not base64; each key is 32 random bytes in base64 "
                                 "(joch admin rotate-secret-key writes one)") from None
        if len(material) != KEY_BYTES:
            raise SecretKeyError(f"{source}: entry {number} is {len(material)} bytes; a key is {KEY_BYTES} "
                                 "random bytes in base64")
        keys.append(material)
    if not keys:
        raise SecretKeyError(f"{source} holds no key: write one base64 32-byte key per line, newest first")
    return keys


class KeyRing:
    """The keys Secret values are sealed with. Thread-safe."""

    def __init__(self, keys: Sequence[bytes], *, source: str, path: Path | None = None) -> None:
        if not keys:
            raise SecretKeyError(f"{source} holds no key")
        self.source = source
        self.path = path
        self._lock = threading.Lock()
        self._stamp = _stamp(path) if path is not None else None
        self._set(keys)

    def _set(self, keys: Sequence[bytes]) -> None:
        self._keys = [Key.of(k) for k in keys]
        self._by_id = {k.id: k for k in self._keys}
        self._ciphers = {k.id: AESGCM(k.material) for k in self._keys}

    @classmethod
    def from_file(cls, path: Path) -> KeyRing:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretKeyError(f'cannot read the secret key file "{path}": '
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        return cls(parse_keys(text, f'secret key file "{path}"'), source=f'secret key file "{path}"', path=path)

    @classmethod
    def from_env(cls, value: str) -> KeyRing:
        return cls(parse_keys(value, ENV), source=ENV)

    @property
    def keys(self) -> list[Key]:
        return list(self._keys)

    @property
    def primary(self) -> Key:
        return self._keys[0]

    @property
    def ids(self) -> list[str]:
        return [k.id for k in self._keys]

    def has(self, kid: str) -> bool:
        return kid in self._by_id or (self.refresh() and kid in self._by_id)

    def refresh(self) -> bool:
        """Re-read the key file when it changed since it was read; True when it did."""
        if self.path is None:
            return False
        with self._lock:
            stamp = _stamp(self.path)
            if stamp == self._stamp or stamp is None:
                return False
            try:
                keys = parse_keys(self.path.read_text(encoding="utf-8"), self.source)
            except (OSError, UnicodeDecodeError, SecretKeyError):
                return False  # half-written or gone: keep the ring we have
            self._stamp = stamp
            self._set(keys)
            return True

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, str]:
        """``(key id, envelope)`` of ``plaintext`` under the primary key."""
        self.refresh()
        key = self.primary
        nonce = random.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[key.id].encrypt(nonce, plaintext, aad)
        return key.id, f"{CIPHER}:{key.id}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, envelope: str, aad: bytes, *, what: str) -> bytes:
        """The plaintext of an envelope; ``SecretKeyError`` naming the key when this ring cannot."""
        cipher, kid, payload = _parts(envelope, what)
        if cipher != CIPHER:
            raise SecretKeyError(f"{what}: sealed with {cipher!r}, which this joch does not know")
        if not self.has(kid):
            raise missing_key(kid, self, what)
        try:
            raw = base64.b64decode(payload, validate=True)
            return self._ciphers[kid].decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
        except (InvalidTag, binascii.Error, ValueError):
            raise SecretKeyError(f"{what}: does not decrypt with key {kid} from {self.source}: the stored "
                                 "value was altered, or belongs to another object") from None


class Sealer:
    """Seals and opens the sensitive values of one object with a ring, or without one (``identity``)."""

    def __init__(self, ring: KeyRing | None) -> None:
        self.ring = ring

    def seal(self, values: dict[str, Any], aad: bytes) -> tuple[str, str]:
        plaintext = json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode()
        if self.ring is None:
            return IDENTITY, f"{IDENTITY}:{IDENTITY}:{base64.b64encode(plaintext).decode()}"
        return self.ring.seal(plaintext, aad)

    def open(self, envelope: str, aad: bytes, *, what: str) -> dict[str, Any]:
        cipher, kid, payload = _parts(envelope, what)
        if cipher == IDENTITY:
            plaintext = base64.b64decode(payload)
        elif self.ring is None:
            raise missing_key(kid, None, what)
        else:
            plaintext = self.ring.open(envelope, aad, what=what)
        values: dict[str, Any] = json.loads(plaintext)
        return values

    def current(self, key_id: str) -> bool:
        """Whether a value sealed under ``key_id`` is sealed the way this sealer would seal it now."""
        return key_id == (IDENTITY if self.ring is None else self.ring.primary.id)


def missing_key(kid: str, ring: KeyRing | None, what: str) -> SecretKeyError:
    if ring is None:
        return SecretKeyError(
            f"{what}: sealed with key {kid}, and this store was opened without a key ring: give the key "
            f"file it was written with (--secret-key-file, or {ENV})")
    return SecretKeyError(
        f"{what}: sealed with key {kid}, which {ring.source} does not have (it has "
        f"{', '.join(ring.ids)}): start with the key file the store's Secrets were written with, or add that "
        "key to the ring (older keys go after the newest)")


def _parts(envelope: str, what: str) -> tuple[str, str, str]:
    cipher, sep, rest = envelope.partition(":")
    kid, sep2, payload = rest.partition(":")
    if not sep or not sep2:
        raise SecretKeyError(f"{what}: not a sealed value Joch wrote")
    return cipher, kid, payload


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def write_key_file(path: Path, keys: Sequence[bytes]) -> None:
    """Write a key file (newest key first) with mode 0600, atomically: a temporary file in the same
    directory, fsynced, renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{random.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_HEADER + "".join(encode_key(k) + "\n" for k in keys))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_ring(*, key_file: Path | None, env_value: str | None, data_dir: Path | None) -> tuple[KeyRing, str | None]:
    """The ring ``joch server`` (and ``joch controller``) uses: ``--secret-key-file``, else
    ``JOCH_SECRET_KEY``, else ``DATA_DIR/secret.key`` — generated (mode 0600) when it does not exist.
    Returns the ring and a note to print (the file was generated), or None."""
    if key_file is not None:
        if not Path(key_file).exists():
            raise SecretKeyError(f'the secret key file "{key_file}" does not exist: create one with joch admin '
                                 f"rotate-secret-key --secret-key-file {key_file}, or leave the flag out to use "
                                 "DATA_DIR/secret.key")
        return KeyRing.from_file(Path(key_file)), None
    if env_value:
        return KeyRing.from_env(env_value), None
    if data_dir is None:
        raise SecretKeyError(f"no secret key: give --secret-key-file or {ENV}")
    path = Path(data_dir) / KEY_FILE_NAME
    if path.exists():
        return KeyRing.from_file(path), None
    write_key_file(path, [new_key()])
    return KeyRing.from_file(path), (f'generated the Secret encryption key file "{path}" (mode 0600): back it up; '
                                     "without it the Secrets in the store cannot be read")


__all__ = ["CIPHER", "ENV", "IDENTITY", "KEY_FILE_NAME", "Key", "KeyRing", "Sealer", "SecretKeyError", "key_id",
           "load_ring", "missing_key", "new_key", "parse_keys", "write_key_file"]
