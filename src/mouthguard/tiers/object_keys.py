"""Validation of object keys: the single gate that keeps every tier inside its root.

A key is a relative, normalised path of ``/``-separated segments. Each segment
uses a conservative alphabet, is not ``.`` or ``..`` and does not start with a
dot (dot-names are reserved for a tier's own temporary files, which must stay
invisible to ``list``). Keys arrive from manifests and configuration, which may
be hostile, so every tier validates every key before touching storage.

"Key" here is an object's name; encryption keys are in
:mod:`mouthguard.tiers.key_material`.
"""

from __future__ import annotations

import re

from mouthguard.errors import InvalidKeyError

MAX_KEY_LENGTH = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,254}")


def validate_segment(segment: str) -> str:
    """Return ``segment`` if it is a safe single path segment, else raise InvalidKeyError."""
    if not isinstance(segment, str) or not _SEGMENT.fullmatch(segment):
        raise InvalidKeyError(f"invalid key segment {segment!r}")
    return segment


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise InvalidKeyError."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"invalid key {key!r}: must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"invalid key: longer than {MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        try:
            validate_segment(segment)
        except InvalidKeyError:
            raise InvalidKeyError(
                f"invalid key {key!r}: segment {segment!r} is not allowed "
                "(no '..', no absolute paths, no empty or dot-prefixed segments)"
            ) from None
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or a valid key (optionally ending with ``/``)."""
    if prefix == "":
        return prefix
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def join_key(*parts: str) -> str:
    """Join validated segments or sub-keys with ``/``."""
    return validate_key("/".join(p.strip("/") for p in parts if p))
