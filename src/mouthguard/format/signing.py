r"""HMAC-signed manifests: tamper evidence, not only corruption detection.

Threat model
------------
* **Corruption** (bit rot, torn writes, a bad copy) is caught without any key:
  every file's xxh3-128 is in the manifest and the manifest checksums its own
  bytes. But both are public functions: anyone who can write to the storage can
  change a rank file, recompute its xxh3 (or sha256) into the manifest and
  re-seal it (:func:`mouthguard.format.sealed.seal` is public). Checksums prove
  integrity against accidents, never against an adversary.
* **Tampering** by someone who can write the storage but does not hold the key
  is caught by a signature: with a manifest key configured, a save records the
  sha256 of every file and appends an HMAC-SHA256, under a secret key, over the
  manifest's exact bytes. A reader with the key requires the signature and
  checks each file's sha256 as it loads, so changing any byte of any file, or of
  the manifest, or swapping files between checkpoints, is rejected (and ``load``
  falls back to an older checkpoint with a warning naming the signature). The
  manifest names its run and step, which the reader compares with where it was
  found, so a validly signed checkpoint cannot be moved to another step.
* **Not covered:** an attacker who holds the key; deleting checkpoints, or
  rolling back to an older validly signed one (there is no freshness counter);
  replaying a signed checkpoint of the same run and step from another store with
  the same key; sidecars (importance, holds, trash marks, receipts) are mutable
  and unsigned, so a tamperer can influence retention but never the bytes a
  keyed reader accepts. Readers **without** a key ignore the signature entirely
  and get corruption detection only. Checkpoints written through
  ``mouthguard.dcp`` are not signed.

Format
------
The signature is one extra member just before the checksum trailer::

    { ...body...,
     "manifest_signature": "hmac-sha256:<key id>:<hex>",
     "manifest_checksum": "xxh3-128:<hex of every byte before the comma>"
    }

The HMAC covers ``b"mouthguard.manifest.v1\0" + key_id + b"\0"`` followed by
every byte of the manifest before the signature member's leading comma; the
xxh3 checksum covers the signature as well. Unsigned manifests are
byte-identical to those written before signatures existed, and older readers
accept signed ones (they ignore the unknown member). Replication copies
manifests byte for byte, so signatures travel with every copy.

Keys
----
``MOUTHGUARD_MANIFEST_KEY`` (or ``signing_key=`` of ``Checkpointer`` and
``open_store``) holds ``[ID=]KEY[,...]`` as :mod:`mouthguard.tiers.key_material`
describes: hex or base64, at least 16 bytes (32 recommended). The key id is
written into the signature so keys can rotate: list the new key first and keep
the old ones after it until their checkpoints are gone.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping

from mouthguard.errors import SignatureError
from mouthguard.format.sealed import SIGNATURE_KEY, signed_part
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring, parse_keyring

ENV_KEY = "MOUTHGUARD_MANIFEST_KEY"
ALGORITHM = "hmac-sha256"
_DOMAIN = b"mouthguard.manifest.v1\x00"
_SIGNATURE = re.compile(r"hmac-sha256:([A-Za-z0-9._-]{1,32}):([0-9a-f]{64})")

#: What ``signing_key=`` accepts: a keyring, raw key bytes, or the env-variable syntax.
KeySpec = Keyring | bytes | str


def manifest_keys(spec: KeySpec | None) -> Keyring | None:
    """A keyring from ``spec`` (None stays None).

    Raises:
        ConfigError: the text or the key is malformed or shorter than 16 bytes.
    """
    if spec is None or isinstance(spec, Keyring):
        return spec
    if isinstance(spec, bytes):
        return parse_keyring("hex:" + spec.hex(), "signing_key")
    return parse_keyring(spec, "signing_key")


def keys_from_env(environ: Mapping[str, str] | None = None) -> Keyring | None:
    """The keyring in ``$MOUTHGUARD_MANIFEST_KEY``, or None when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(ENV_KEY, "")
    return parse_keyring(value, f"${ENV_KEY}") if value.strip() else None


def _mac(key: bytes, key_id: str, signed: bytes) -> str:
    return hmac.new(key, _DOMAIN + key_id.encode() + b"\x00" + signed, hashlib.sha256).hexdigest()


class SignFunction:
    """The ``sign`` callable of :func:`~mouthguard.format.sealed.seal`: the current key signs."""

    def __init__(self, keys: Keyring) -> None:
        self._keys = keys

    def __call__(self, signed: bytes) -> str:
        """The signature text of ``signed`` (the manifest bytes before the signature)."""
        kid = self._keys.current
        return f"{ALGORITHM}:{kid}:{_mac(self._keys.current_key, kid, signed)}"

    def __repr__(self) -> str:
        return f"SignFunction({self._keys!r})"


def verify(raw: bytes, body: Mapping[str, JsonValue], keys: Keyring) -> str:
    """Check the signature of an unsealed manifest ``raw`` (parsed: ``body``); return its key id.

    Raises:
        SignatureError: unsigned, malformed, made with an unknown key id, or wrong.
    """
    part = signed_part(raw)
    claimed = body.get(SIGNATURE_KEY)
    if part is None and claimed is None:
        raise SignatureError(
            "manifest is not signed, but a manifest key is configured (signature required)"
        )
    if part is None or claimed != part[1]:
        raise SignatureError("manifest signature member is malformed or misplaced")
    signed, text = part
    match = _SIGNATURE.fullmatch(text)
    if match is None:
        raise SignatureError(f"manifest signature is malformed (expected {ALGORITHM}:<id>:<hex>)")
    kid, mac = match.group(1), match.group(2)
    key = keys.keys.get(kid)
    if key is None:
        raise SignatureError(
            f"manifest signature uses key id {kid!r}, which is not configured "
            f"(configured: {sorted(keys.keys)})"
        )
    if not hmac.compare_digest(_mac(key, kid, signed), mac):
        raise SignatureError(
            f"manifest signature does not verify with key {kid!r}: tampered, or the wrong key"
        )
    return kid
