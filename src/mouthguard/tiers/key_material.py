"""Secret keys from the environment: parsing, key ids, and keeping them out of messages.

One syntax serves the manifest signing key (``MOUTHGUARD_MANIFEST_KEY``) and the
encryption keys of encrypted tiers (``encryption_key_env = "NAME"``)::

    [ID=]KEY[,[ID=]KEY...]

* ``KEY`` is ``hex:<hex>``, ``base64:<base64>``, or bare hex / base64 (hex is tried
  first: a bare value of hex digits is read as hex).
* ``ID`` names the key (letters, digits, ``.``, ``_``, ``-``; at most 32). Without
  it the id is the key's fingerprint, the first 8 bytes of a domain-separated
  sha256 of the key, in hex; safe to store next to the data (it reveals nothing
  usable about a 128-bit or larger key).
* The **first** key is the current one (it signs or encrypts); every listed key is
  accepted for reading. Key rotation: put the new key first and keep the old one
  listed until nothing signed or encrypted with it remains.

Error messages name the variable and the entry's position, never a key's bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from typing_extensions import override

from mouthguard.errors import ConfigError

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,32}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


def key_fingerprint(key: bytes) -> str:
    """The default id of ``key``: 16 hex digits of a domain-separated sha256."""
    return hashlib.sha256(b"mouthguard key id\x00" + key).hexdigest()[:16]


def validate_key_id(key_id: str) -> str:
    """Return ``key_id`` if it is a valid key id, else raise ConfigError."""
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise ConfigError(f"invalid key id {key_id!r}: 1-32 letters, digits, '.', '_' or '-'")
    return key_id


def decode_key(text: str, where: str) -> bytes:
    """Decode one key written ``hex:...``, ``base64:...`` or bare hex/base64."""
    text = text.strip()
    try:
        if text.startswith("hex:"):
            return bytes.fromhex(text[4:])
        if text.startswith("base64:"):
            return base64.b64decode(text[7:], validate=True)
        if _HEX.fullmatch(text):
            return bytes.fromhex(text)
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        raise ConfigError(f"{where}: not valid hex or base64 (value not shown)") from None


@dataclass(frozen=True)
class Keyring:
    """Named secret keys: ``current`` writes, every key in ``keys`` reads.

    The repr shows key ids only, so a keyring in a log line or a traceback never
    leaks key material.
    """

    current: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ConfigError(f"the current key id {self.current!r} is not in the keyring")

    @property
    def current_key(self) -> bytes:
        """The bytes of the current key."""
        return self.keys[self.current]

    @override
    def __repr__(self) -> str:
        return f"Keyring(current={self.current!r}, ids={sorted(self.keys)!r})"

    @classmethod
    def single(cls, key: bytes, key_id: str | None = None) -> Keyring:
        """A keyring of one key (id: ``key_id`` or the key's fingerprint)."""
        kid = validate_key_id(key_id) if key_id is not None else key_fingerprint(key)
        return cls(kid, {kid: bytes(key)})


def parse_keyring(
    text: str, where: str, *, min_bytes: int = 16, exact_bytes: int | None = None
) -> Keyring:
    """Parse ``[ID=]KEY[,[ID=]KEY...]`` (see the module docstring).

    Args:
        text: the value (usually an environment variable's).
        where: what to call it in errors (e.g. ``$MOUTHGUARD_MANIFEST_KEY``).
        min_bytes: the shortest key accepted.
        exact_bytes: if given, every key must be exactly this long (AES-256: 32).

    Raises:
        ConfigError: empty, malformed, too short, or a duplicate id. The message
            never contains key material.
    """
    keys: dict[str, bytes] = {}
    current: str | None = None
    entries = [e.strip() for e in text.split(",")]
    if not any(entries):
        raise ConfigError(f"{where} is empty")
    for n, item in enumerate(entries, start=1):
        spot = f"{where} entry {n}"
        entry = item
        if not entry:
            raise ConfigError(f"{spot} is empty")
        key_id: str | None = None
        if "=" in entry.rstrip("="):  # base64 padding is not an id separator
            head, _, rest = entry.partition("=")
            if not _KEY_ID.fullmatch(head):
                raise ConfigError(f"{spot}: invalid key id before '=' (value not shown)")
            key_id, entry = head, rest
        key = decode_key(entry, spot)
        if exact_bytes is not None and len(key) != exact_bytes:
            raise ConfigError(f"{spot}: the key must be {exact_bytes} bytes, got {len(key)}")
        if len(key) < min_bytes:
            raise ConfigError(f"{spot}: the key must be at least {min_bytes} bytes")
        kid = key_id if key_id is not None else key_fingerprint(key)
        if kid in keys:
            raise ConfigError(f"{spot}: duplicate key id {kid!r}")
        keys[kid] = key
        current = current or kid
    assert current is not None
    return Keyring(current, keys)
