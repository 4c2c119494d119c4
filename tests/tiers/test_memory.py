"""MemoryTier: the conformance suite plus RAM-specific behaviour."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mouthguard.testing.conformance import TierConformance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.memory import MemoryTier


class TestMemoryTier(TierConformance):
    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return MemoryTier


def test_defaults_and_capabilities() -> None:
    tier = MemoryTier()
    assert (tier.name, tier.domain) == ("memory", "ram")
    caps = tier.capabilities
    assert caps.atomic_rename
    assert caps.conditional_put
    assert not caps.object_lock
    assert not caps.durable
    assert not caps.persistent


def test_location_format() -> None:
    assert MemoryTier(name="fast").location("runs/a/") == "memory://fast/runs/a/"
    assert MemoryTier().location() == "memory://memory/"


def test_instances_are_independent() -> None:
    one, two = MemoryTier(), MemoryTier()
    one.put("k", b"v")
    assert not two.exists("k")
