"""One rule for damage in every job: a timeout or an I/O error never moves or removes a copy.

Each test makes one tier fail its reads (as a timed-out or dead store does) and
runs one path that judges copies: scrub, a copy onto an existing destination,
the replicator, retention's re-check before a demotion. Every copy must still be
committed, in place and loadable afterwards.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.gathering import gather
from mouthguard.checkpoint.sidecars import CopyRef, report_damage
from mouthguard.errors import TierError
from mouthguard.jobs.copy import copy_checkpoint
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import _first_damaged_other_copy
from mouthguard.jobs.scrub import scrub
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from tests.checkpoint.helpers import flip_byte

READS = frozenset({"get", "read_into"})


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _protected(store: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(4096, dtype=torch.float32)}, importance="milestone")
    assert Replicator(store).run_once().protected == 1


def _with_dead(store: mouthguard.Store, name: str) -> mouthguard.Store:
    tiers = [
        FaultyTier(t, FaultPlan(error=1.0, ops=READS)) if t.name == name else t for t in store.tiers
    ]
    return mouthguard.Store(tiers, source=store.source, policy=store.policy)


def _copies_untouched(store: mouthguard.Store, before: list[str]) -> None:
    root = Path(store.source).parent
    after = [f for f in _files(root) if "sidecar." not in f]
    assert after == [f for f in before if "sidecar." not in f]
    assert not any(".rejected-" in f for f in _files(root))


def test_scrub_of_an_unreachable_tier_reports_it_and_touches_nothing(
    two_tier: mouthguard.Store,
) -> None:
    _protected(two_tier)
    before = _files(Path(two_tier.source).parent)
    report = scrub(_with_dead(two_tier, "durable"), max_age_seconds=0)
    assert sorted((r.tier, r.status.value) for r in report.results) == [
        ("durable", "unreachable"),
        ("fast", "ok"),
    ]
    _copies_untouched(two_tier, before)
    assert mouthguard.Checkpointer(two_tier, "r", background=False).info(1).state == "protected"  # type: ignore[union-attr]


def test_copy_onto_a_destination_it_cannot_read_fails_and_leaves_it(
    two_tier: mouthguard.Store,
) -> None:
    _protected(two_tier)
    before = _files(Path(two_tier.source).parent)
    broken = _with_dead(two_tier, "durable")
    with pytest.raises(TierError, match="cannot verify the existing copy"):
        copy_checkpoint(broken.tier("fast"), broken.tier("durable"), "r", 1)
    _copies_untouched(two_tier, before)


def test_replicator_keeps_a_copy_it_cannot_read_now(two_tier: mouthguard.Store) -> None:
    _protected(two_tier)
    # A damage report withdraws the receipt: the next pass must read the copy again.
    durable = CopyRef(two_tier.tier("durable"), "r", 1)
    report_damage(durable, "a reader saw damage", dt.datetime.now(dt.UTC))
    before = _files(Path(two_tier.source).parent)
    report = Replicator(_with_dead(two_tier, "durable")).run_once()
    assert any("cannot verify" in s.reason for s in report.shortfalls)
    _copies_untouched(two_tier, before)


def test_replicator_never_hides_the_last_copies_even_when_damaged(
    two_tier: mouthguard.Store,
) -> None:
    _protected(two_tier)
    for tier in two_tier.tiers:
        flip_byte(Path(tier.location("r/000000000001/rank-00000.safetensors")), 6000)
    for tier in two_tier.tiers:
        report_damage(CopyRef(tier, "r", 1), "found by a reader", dt.datetime.now(dt.UTC))
    report = Replicator(two_tier).run_once()
    assert sum("no intact copy to repair from: kept" in s.reason for s in report.shortfalls) == 2
    info = mouthguard.Checkpointer(two_tier, "r", background=False).info(1)
    assert info is not None and info.state == "damaged"
    assert not any(".rejected-" in f for f in _files(Path(two_tier.source).parent))


def test_retention_does_not_demote_on_the_strength_of_a_copy_it_cannot_read(
    two_tier: mouthguard.Store,
) -> None:
    _protected(two_tier)
    broken = _with_dead(two_tier, "durable")
    view = gather(broken, "r", 1)
    assert view is not None
    why = _first_damaged_other_copy(view, "fast", dt.datetime.now(dt.UTC))
    assert why is not None and why.startswith("not demoted")
    assert mouthguard.Checkpointer(two_tier, "r", background=False).info(1).state == "protected"  # type: ignore[union-attr]
