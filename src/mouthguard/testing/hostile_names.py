"""Hostile names: the one table every validator of a path-like name is tested against.

Each name here would, joined to a directory or used as a key, reach outside it,
name something else than it seems, or break whoever reads it: absolute paths,
``..`` components, empty parts, control characters (NUL among them),
backslashes, undecodable text and names longer than any path. Every validator
in mouthguard refuses all of them (``tests/test_pathsafety.py``), and the tier
conformance suite makes every tier refuse them as keys
(:data:`mouthguard.testing.conformance.INVALID_KEYS` starts with them). A tier
or a format written elsewhere can hold its own validators to the same table.
"""

from __future__ import annotations

#: What each name tries -> the name.
HOSTILE_NAMES: dict[str, str] = {
    "absolute path": "/etc/passwd",
    "the root itself": "/",
    "absolute, doubled slash": "//srv/x",
    "parent first": "../x",
    "parent past the root": "a/../../x",
    "parent last": "a/..",
    "parent alone": "..",
    "parent, trailing slash": "../",
    "empty name": "",
    "empty part": "a//b",
    "trailing slash": "a/",
    "NUL": "a\x00b",
    "NUL at the end": "weights.bin\x00.txt",
    "newline": "a\nb",
    "escape character": "a\x1b[2Jb",
    "DEL": "a\x7fb",
    "backslash": "a\\b",
    "backslash traversal": "..\\..\\x",
    "undecodable byte (a lone surrogate)": "a\udcffb",
    "longer than PATH_MAX in parts": "a/" * 2100 + "b",
    "one part longer than PATH_MAX": "a" * 5000,
}

__all__ = ["HOSTILE_NAMES"]
