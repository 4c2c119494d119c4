r"""Path safety: the one rule for a name that will become a path or a key under a root.

Names arrive from places an attacker may write: manifests, indexes, tar members,
checkpoint directories saved by someone else, configuration. Every validator of
such a name in mouthguard (object keys, run and step names, stored file names,
dataset sample keys, tar member names, hub snapshot entries) starts from
:func:`relative_path_problem` and adds only the rules of its own format (an
alphabet, a suffix, WebDataset's key split), so that no validator forgets a case:
``tests/test_pathsafety.py`` holds one table of hostile names and runs every
caller against it.

The rule: a non-empty string of ``/``-separated segments that stays below the
directory it is joined to, on any filesystem mouthguard writes to --

* valid UTF-8 (no lone surrogates, which ``os.fsdecode`` makes of undecodable bytes);
* at most ``max_bytes`` bytes of UTF-8 (:data:`PATH_MAX` unless the caller is
  stricter): longer names fail at ``open`` with a less helpful error, or are a
  memory attack on whoever reads them;
* no control character (NUL among them: C truncates there, Python raises) and no
  backslash (a separator on Windows and in some tar writers: ``..\x`` escapes there);
* not absolute (no leading ``/``);
* no empty segment (``a//b``, a trailing ``/``) and no ``..`` segment;
* no ``.`` segment, unless the caller allows it (``tar -C dir .`` writes ``./a``:
  harmless in a tar member name, a second spelling of one key elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: Linux's ``PATH_MAX``, in bytes: no longer path can be opened in one call.
PATH_MAX = 4096

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Names with nothing to refuse, recognised in one match (most names are): ASCII
#: segments that neither are empty nor start with a dot.
_PLAIN = re.compile(r"[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]*(?:/[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]*)*")


def relative_path_problem(
    name: object, *, max_bytes: int = PATH_MAX, dot_segments: bool = False
) -> str | None:
    """Why ``name`` is not a safe relative path (see the module docstring); None if it is.

    The reason reads after the name, e.g. ``f"member {name!r} {why}"``.

    Args:
        name: the candidate; anything but a ``str`` is refused.
        max_bytes: the most bytes of UTF-8 the caller accepts.
        dot_segments: whether ``.`` segments (``./a``, ``a/.``) are allowed.
    """
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if len(name) <= max_bytes and _PLAIN.fullmatch(name) is not None:
        return None  # ASCII: as many bytes as characters
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    segments = name.split("/")
    problems = (
        (size > max_bytes, f"is longer than {max_bytes} bytes"),
        (_CONTROL.search(name) is not None, "contains a control character"),
        ("\\" in name, "contains a backslash"),
        (name.startswith("/"), "is an absolute path"),
        (".." in segments, "has a '..' path segment (path traversal)"),
        ("" in segments, "has an empty path segment"),
        (not dot_segments and "." in segments, "has a '.' path segment"),
    )
    return next((why for bad, why in problems if bad), None)


def check_relative_path(
    name: object,
    what: str,
    error: Callable[[str], Exception],
    *,
    max_bytes: int = PATH_MAX,
    dot_segments: bool = False,
) -> str:
    """Return ``name`` if :func:`relative_path_problem` accepts it, else raise.

    Args:
        name: the candidate.
        what: what the name is, to start the message (``"stored file name"``).
        error: the caller's exception type (or factory), given the message.
        max_bytes: as for :func:`relative_path_problem`.
        dot_segments: as for :func:`relative_path_problem`.

    Raises:
        Exception: ``error(f"{what} {name!r} {why}")`` (the name cut to 200 characters).
    """
    why = relative_path_problem(name, max_bytes=max_bytes, dot_segments=dot_segments)
    if why is not None or not isinstance(name, str):
        raise error(f"{what} {name!r:.200} {why}")
    return name


def is_safe_relative_path(name: object, *, max_bytes: int = PATH_MAX) -> bool:
    """Whether :func:`relative_path_problem` finds nothing wrong with ``name``."""
    return relative_path_problem(name, max_bytes=max_bytes) is None


__all__ = [
    "PATH_MAX",
    "check_relative_path",
    "is_safe_relative_path",
    "relative_path_problem",
]
