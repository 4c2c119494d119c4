"""The package's version comes from the distribution's metadata (pyproject.toml)."""

from __future__ import annotations

from importlib import metadata

import mouthguard
from mouthguard.version import UNKNOWN_VERSION, installed_version


def test_version_is_the_distributions() -> None:
    assert mouthguard.__version__ == metadata.version("mouthguard")


def test_missing_metadata_gives_a_valid_placeholder() -> None:
    assert installed_version("mouthguard-no-such-distribution") == UNKNOWN_VERSION
