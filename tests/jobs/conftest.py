"""Fixtures for job tests: a store with tiers in distinct failure domains."""

from __future__ import annotations

from pathlib import Path

import pytest

import mouthguard


def make_store(root: Path, *tiers: tuple[str, str]) -> mouthguard.Store:
    """A store of local tiers ``(name, domain)`` under ``root``, fast first."""
    lines = []
    for name, domain in tiers:
        lines += [
            "[[tiers]]",
            f'name = "{name}"',
            'kind = "local"',
            f'path = "{name}"',
            f'domain = "{domain}"',
            "",
        ]
    config = root / "mouthguard.toml"
    root.mkdir(parents=True, exist_ok=True)
    config.write_text("\n".join(lines))
    return mouthguard.open_store(config)


@pytest.fixture
def two_tier(tmp_path: Path) -> mouthguard.Store:
    """fast (node-a) + durable (node-b)."""
    return make_store(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))


@pytest.fixture
def three_tier(tmp_path: Path) -> mouthguard.Store:
    """fast (node-a) + pfs (rack-1) + archive (region-1)."""
    return make_store(
        tmp_path / "three", ("fast", "node-a"), ("pfs", "rack-1"), ("archive", "region-1")
    )
