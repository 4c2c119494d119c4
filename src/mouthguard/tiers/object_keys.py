"""Validation of object keys: the single gate that keeps every tier inside its root.

A key is a relative, normalised path of ``/``-separated segments: it passes the
path rule every name in mouthguard passes (:mod:`mouthguard.pathsafety`), and
each segment uses a conservative alphabet, is not ``.`` or ``..`` and does not start with a
dot (dot-names are reserved for a tier's own temporary files, which must stay
invisible to ``list``). Keys arrive from manifests and configuration, which may
be hostile, so every tier validates every key before touching storage.

Besides single keys, the module holds the checks of the key-shaped arguments
every tier shares (``list_dirs`` prefixes, ``rename_prefix`` source and
destination), so that all tiers reject the same inputs with the same errors,
and the true/false forms tiers use to skip names found in storage that are not
keys (temporary files, foreign objects) instead of failing on them.

"Key" here is an object's name; encryption keys are in
:mod:`mouthguard.tiers.key_material`.
"""

from __future__ import annotations

import re

from mouthguard.errors import InvalidKeyError, TierError
from mouthguard.pathsafety import relative_path_problem

MAX_KEY_LENGTH = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,254}")


def is_valid_segment(name: object) -> bool:
    """Whether ``name`` is a safe single path segment (dot-names and odd names are not)."""
    return isinstance(name, str) and _SEGMENT.fullmatch(name) is not None


def validate_segment(segment: str) -> str:
    """Return ``segment`` if it is a safe single path segment, else raise InvalidKeyError."""
    if not is_valid_segment(segment):
        raise InvalidKeyError(f"invalid key segment {segment!r}")
    return segment


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise InvalidKeyError."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"invalid key {key!r}: must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"invalid key: longer than {MAX_KEY_LENGTH} characters")
    why = relative_path_problem(key, max_bytes=MAX_KEY_LENGTH)
    if why is not None:
        raise InvalidKeyError(f"invalid key {key!r}: it {why}")
    for segment in key.split("/"):  # the path is safe; now the alphabet
        if not is_valid_segment(segment):
            raise InvalidKeyError(
                f"invalid key {key!r}: segment {segment!r} is not allowed "
                "(letters, digits, '_.=+-', not starting with a dot, at most 255)"
            )
    return key


def is_valid_key(key: str) -> bool:
    """Whether :func:`validate_key` accepts ``key`` (it decides: one rule, two forms)."""
    try:
        validate_key(key)
    except InvalidKeyError:
        return False
    return True


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or a valid key (optionally ending with ``/``)."""
    if prefix == "":
        return prefix
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def validate_dir_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid ``list_dirs`` prefix: empty or ending with ``/``.

    Raises:
        InvalidKeyError: the prefix is not a valid key or does not end with ``/``.
    """
    validate_prefix(prefix)
    if prefix and not prefix.endswith("/"):
        raise InvalidKeyError(f"invalid directory prefix {prefix!r}: must be empty or end with '/'")
    return prefix


def validate_rename(src: str, dst: str) -> tuple[str, str]:
    """Check the arguments of ``rename_prefix``; return them as ``/``-ended prefixes.

    Renames nothing: every tier calls it before it moves anything.

    Args:
        src: the source prefix, with or without a trailing ``/``.
        dst: the destination prefix, with or without a trailing ``/``.

    Returns:
        ``(src + "/", dst + "/")``.

    Raises:
        InvalidKeyError: either prefix is not a valid key.
        TierError: the prefixes are equal or one contains the other; a POSIX
            rename refuses that too, so every tier refuses it.
    """
    src_key = validate_key(src.removesuffix("/"))
    dst_key = validate_key(dst.removesuffix("/"))
    src_p, dst_p = src_key + "/", dst_key + "/"
    if src_p.startswith(dst_p) or dst_p.startswith(src_p):
        raise TierError(f"cannot rename {src_key!r} to {dst_key!r}: the prefixes overlap")
    return src_p, dst_p


def join_key(*parts: str) -> str:
    """Join validated segments or sub-keys with ``/``."""
    return validate_key("/".join(p.strip("/") for p in parts if p))
