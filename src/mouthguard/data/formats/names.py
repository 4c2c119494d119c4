"""Names in a dataset: its object layout, and the sample keys and extensions it accepts.

Layout under the dataset's prefix (every name passes :mod:`mouthguard.tiers.object_keys`)::

    <prefix>/shards/shard-000000.tar          # WebDataset-compatible tar shards
    <prefix>/shards/shard-000000.index.json   # where each sample and member lies in it
    <prefix>/dataset.json                     # the manifest: written last, create-only

An **adopted** dataset (``mouthguard data index``) keeps the user's files where they
are and puts everything of ours under one sub-prefix beside them::

    <src>/any/path/part-0.tar                             # the user's files, untouched
    <src>/mouthguard-index/shards/any/path/part-0.index.json
    <src>/mouthguard-index/dataset.json                   # written last, create-only

The manifest names the user's files by their path relative to ``<src>``
(:func:`check_data_path`: a valid tier key, never under ``mouthguard-index/``).

Sample keys and extensions follow WebDataset's own rule for splitting a member
name: the key is the path up to the first dot of the basename, the extension is
the rest (``train/x.seg.png`` -> key ``train/x``, extension ``seg.png``), and
readers lowercase the extension. A key or extension that WebDataset would split
or rename differently is refused here, so what a reader sees is exactly what
was written.
"""

from __future__ import annotations

import re

from mouthguard.errors import InvalidKeyError, SampleError
from mouthguard.pathsafety import relative_path_problem
from mouthguard.tiers.object_keys import validate_key

MANIFEST_NAME = "dataset.json"
SHARDS_DIR = "shards"
#: Where an adopted dataset's manifest and indexes live, beside the user's files. No
#: leading dot: tiers hide dot-names (their own temporary files) from listings.
INDEX_DIR = "mouthguard-index"
#: ``shard-000000.tar``: six digits sort correctly up to a million shards (256 TiB at 256 MiB).
_SHARD = re.compile(r"shard-([0-9]{6,9})\.tar")
_INDEX_SUFFIX = ".index.json"
#: Lowercase (WebDataset lowercases extensions), dot-separated parts, no leading underscore.
_EXT = re.compile(r"[a-z0-9][a-z0-9_+-]{0,63}(?:\.[a-z0-9][a-z0-9_+-]{0,63}){0,3}")
MAX_KEY_BYTES = 200


def shard_name(number: int) -> str:
    """``shard-000042.tar`` for shard 42."""
    return f"shard-{number:06d}.tar"


def index_name(shard: str) -> str:
    """The index object's name of ``shard`` (``shard-000042.index.json``)."""
    return shard.removesuffix(".tar") + _INDEX_SUFFIX


#: What an adopted tar's name ends with: plain, or gzip-compressed (read as a stream).
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
#: The gzip-compressed ones among them.
GZIP_SUFFIXES = (".tar.gz", ".tgz")


def is_gzip_tar(path: str) -> bool:
    """Whether the adopted tar ``path`` is gzip-compressed (by its name: ``.tar.gz``, ``.tgz``)."""
    return path.endswith(GZIP_SUFFIXES)


def adopted_index_name(path: str) -> str:
    """The index name of an adopted tar ``path`` (``a/x.tar``, ``a/x.tgz`` -> ``a/x.index.json``).

    ``x.tar`` and ``x.tar.gz`` side by side share it: :func:`~mouthguard.data.index_dataset`
    refuses that pair by name.
    """
    for suffix in GZIP_SUFFIXES:
        if path.endswith(suffix):
            return path.removesuffix(suffix) + _INDEX_SUFFIX
    return path.removesuffix(".tar") + _INDEX_SUFFIX


def check_data_path(path: object, suffix: str | tuple[str, ...]) -> str:
    """Return ``path`` if it may name a user's data file of an adopted dataset.

    Rules: a valid tier key (relative, ``/``-separated segments of a conservative
    alphabet, no ``..``, no dot-prefixed segment), ending with ``suffix`` (or one of
    them) after at least one character, and not
    under :data:`INDEX_DIR` (which is ours).

    Raises:
        InvalidKeyError: the path breaks a rule; the message says which.
    """
    if not isinstance(path, str):
        raise InvalidKeyError(f"data file path {path!r:.80} is not a string")
    validate_key(path)
    suffixes = (suffix,) if isinstance(suffix, str) else suffix
    if not any(path.endswith(s) and len(path) > len(s) for s in suffixes):
        shown = " or ".join(repr(s) for s in suffixes)
        raise InvalidKeyError(f"data file path {path!r:.80} does not end with {shown}")
    if path.split("/", 1)[0] == INDEX_DIR:
        raise InvalidKeyError(f"data file path {path!r:.80} is under {INDEX_DIR}/, which is ours")
    return path


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
    USTAR tar header: :func:`mouthguard.data.formats.tarfmt.member_header`).

    Raises:
        SampleError: the key breaks a rule; the message says which.
    """
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key {key!r} must be a non-empty string ('__key__')")
    why = _key_problem(key)
    if why is not None:
        raise SampleError(f"sample key {key!r} {why}")
    return key


#: Keys that break no rule of :func:`check_key`, recognised in one match: ASCII
#: segments of letters, digits, ``_+-`` (the first not starting with ``_``), no dots.
#: Checking an index's keys is most of the cost of reading an index, once per
#: DataLoader worker and epoch; other keys take the full check.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9+-][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+)*")


def is_plain_key(key: str) -> bool:
    """Whether ``key`` passes :func:`check_key` by the one-match rule (False: check it in full)."""
    return len(key) <= MAX_KEY_BYTES and _PLAIN_KEY.fullmatch(key) is not None  # ASCII


def _key_problem(key: str) -> str | None:
    return None if is_plain_key(key) else _any_key_problem(key)


def _any_key_problem(key: str) -> str | None:
    # The path rules are the project's one path-safety check; what follows them
    # is WebDataset's own reading of a name.
    generic = relative_path_problem(key, max_bytes=MAX_KEY_BYTES, dot_segments=False)
    if generic is not None:
        return generic
    segments = key.split("/")
    if key.startswith("_"):
        return "starts with '_' (WebDataset treats such names as metadata)"
    if "." in segments[-1]:
        return (
            "has a dot in its last path segment: WebDataset would cut the key there "
            f"({segments[-1].split('.', 1)[0]!r}) and read the rest as the extension"
        )
    return None


def member_name(key: str, ext: str) -> str:
    """The tar member name of extension ``ext`` of sample ``key``: ``key.ext``."""
    return f"{key}.{ext}"


# --- adopted tars: what WebDataset makes of any member name ------------------------

#: WebDataset's own split (``webdataset.tariterators.base_plus_ext``): the key is the
#: path up to the first dot of the basename, the extension the rest.
_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Names WebDataset skips as metadata (``tar_file_iterator``'s ``skip_meta``).
_WDS_META = re.compile(r"__[^/]*__($|/)")
#: Adopted keys may be longer than ours (GNU and PAX tars hold long names), not unbounded.
MAX_ADOPTED_KEY_BYTES = 4096
MAX_ADOPTED_EXT_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Keys a WebDataset sample dict holds besides its members.
_RESERVED_EXTS = frozenset({"__key__", "__url__", "__local_path__"})


def webdataset_split(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` as WebDataset groups tar member ``name``; None if it skips it.

    WebDataset skips metadata names (``__*__``) and names without a dot in their
    basename, and lowercases extensions; this does the same, so an adopted index
    describes exactly the samples ``webdataset.WebDataset`` would yield.
    """
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    if _WDS_META.match(name):
        return None
    match = _WDS_SPLIT.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def member_path_problem(name: str) -> str | None:
    """Why a tar member name is refused in an adopted tar (None: it is not).

    Refused whatever the member's type: absolute paths, ``..``, empty segments,
    control characters, backslashes, and names that are not valid UTF-8 (tarfile
    hands those over with surrogates). ``./`` segments, which ``tar -C dir .``
    writes, are harmless and allowed.
    """
    return relative_path_problem(name, max_bytes=MAX_ADOPTED_KEY_BYTES, dot_segments=True)


def adopted_ext_problem(ext: str) -> str | None:
    """Why ``ext`` cannot be a member of an adopted sample (None: it can)."""
    if not ext:
        return "has an empty extension"
    if ext != ext.lower():
        return "has an extension WebDataset would lowercase"
    if len(ext.encode("utf-8", "surrogatepass")) > MAX_ADOPTED_EXT_BYTES:
        return f"has an extension longer than {MAX_ADOPTED_EXT_BYTES} bytes"
    if "/" in ext or _CONTROL.search(ext) is not None:
        return "has an extension with a '/' or a control character"
    if ext in _RESERVED_EXTS:  # WebDataset fails on these; in our dict they would clash
        return f"has the extension {ext!r}, which names sample metadata"
    return None
