"""Names in a dataset: its object layout, and the sample keys and extensions it accepts.

Layout under the dataset's prefix (every name passes :mod:`mouthguard.tiers.object_keys`)::

    <prefix>/shards/shard-000000.tar          # WebDataset-compatible tar shards
    <prefix>/shards/shard-000000.index.json   # where each sample and member lies in it
    <prefix>/dataset.json                     # the manifest: written last, create-only

Sample keys and extensions follow WebDataset's own rule for splitting a member
name: the key is the path up to the first dot of the basename, the extension is
the rest (``train/x.seg.png`` -> key ``train/x``, extension ``seg.png``), and
readers lowercase the extension. A key or extension that WebDataset would split
or rename differently is refused here, so what a reader sees is exactly what
was written.
"""

from __future__ import annotations

import re

from mouthguard.errors import SampleError

MANIFEST_NAME = "dataset.json"
SHARDS_DIR = "shards"
#: ``shard-000000.tar``: six digits sort correctly up to a million shards (256 TiB at 256 MiB).
_SHARD = re.compile(r"shard-([0-9]{6,9})\.tar")
_INDEX_SUFFIX = ".index.json"
#: Lowercase (WebDataset lowercases extensions), dot-separated parts, no leading underscore.
_EXT = re.compile(r"[a-z0-9][a-z0-9_+-]{0,63}(?:\.[a-z0-9][a-z0-9_+-]{0,63}){0,3}")
#: A key segment: anything printable except ``/`` and ``\\`` (tar and WebDataset split on ``/``).
_SEGMENT_BAD = re.compile(r"[\x00-\x1f\x7f\\]")
MAX_KEY_BYTES = 200


def shard_name(number: int) -> str:
    """``shard-000042.tar`` for shard 42."""
    return f"shard-{number:06d}.tar"


def index_name(shard: str) -> str:
    """The index object's name of ``shard`` (``shard-000042.index.json``)."""
    return shard.removesuffix(".tar") + _INDEX_SUFFIX


def is_shard_name(name: str) -> bool:
    """Whether ``name`` is a shard name this format writes."""
    return _SHARD.fullmatch(name) is not None


def is_valid_ext(ext: str) -> bool:
    """Whether ``ext`` is an extension WebDataset reads back unchanged."""
    return _EXT.fullmatch(ext) is not None


def check_ext(ext: str, key: str) -> str:
    """Return ``ext`` if WebDataset reads it back unchanged, else raise SampleError."""
    if not isinstance(ext, str) or not _EXT.fullmatch(ext):
        raise SampleError(
            f"sample {key!r}: member {ext!r} is not a valid extension (lowercase letters, "
            "digits, '_', '+', '-', dot-separated parts; WebDataset lowercases extensions)"
        )
    return ext


def check_key(key: object) -> str:
    """Return ``key`` if it is a sample key WebDataset splits back identically.

    Rules: a non-empty ``/``-separated path of non-empty segments, none ``.`` or
    ``..``; no dot in the last segment (WebDataset cuts the key at the first dot
    of the basename); not starting with ``_`` (WebDataset skips ``__*__`` names as
    metadata); no control characters or backslashes; at most ``MAX_KEY_BYTES``
    bytes of UTF-8 (and the writer refuses a member name that does not fit a
    USTAR tar header: :func:`mouthguard.data.tarfmt.member_header`).

    Raises:
        SampleError: the key breaks a rule; the message says which.
    """
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key {key!r} must be a non-empty string ('__key__')")
    why = _key_problem(key)
    if why is not None:
        raise SampleError(f"sample key {key!r} {why}")
    return key


def _key_problem(key: str) -> str | None:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode"
    segments = key.split("/")
    problems = (
        (size > MAX_KEY_BYTES, f"is longer than {MAX_KEY_BYTES} bytes of UTF-8"),
        (_SEGMENT_BAD.search(key) is not None, "contains a control character or a backslash"),
        (key.startswith("_"), "starts with '_' (WebDataset treats such names as metadata)"),
        (any(s in ("", ".", "..") for s in segments), "has an empty, '.' or '..' path segment"),
        (
            "." in segments[-1],
            "has a dot in its last path segment: WebDataset would cut the key there "
            f"({segments[-1].split('.', 1)[0]!r}) and read the rest as the extension",
        ),
    )
    return next((why for bad, why in problems if bad), None)


def member_name(key: str, ext: str) -> str:
    """The tar member name of extension ``ext`` of sample ``key``: ``key.ext``."""
    return f"{key}.{ext}"
