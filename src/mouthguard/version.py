"""The installed distribution's version, from its metadata: ``pyproject.toml`` is the one source.

A layer of its own below everything else, so that any module (the checkpoint
writer records the version in every manifest) can know it without importing the
top-level package, which sits above every layer.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "mouthguard"
#: Reported when the distribution's metadata is missing (a source tree used
#: without being installed): a valid PEP 440 version that sorts before any release.
UNKNOWN_VERSION = "0+unknown"


def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The version of the installed ``distribution``, or :data:`UNKNOWN_VERSION`."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


#: This package's version, read once at import.
VERSION = installed_version()
