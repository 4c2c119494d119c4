"""Scrubbing finds silent damage in copies whose receipt has aged, and gets them repaired."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import mouthguard
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.scrub import scrub
from tests.checkpoint.helpers import flip_byte


def _protected(store: mouthguard.Store, steps: int) -> mouthguard.Checkpointer:
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    for step in range(1, steps + 1):
        ckpt.save(step, {"w": torch.full((2048,), float(step))}, importance="milestone")
    Replicator(store).run_once()
    return ckpt


def test_fresh_receipts_are_not_reread(two_tier: mouthguard.Store) -> None:
    _protected(two_tier, 2)
    report = scrub(two_tier, max_age_seconds=3600)
    assert report.results == [] and report.skipped_fresh == 4


def test_bit_rot_behind_a_receipt_is_found_set_aside_and_repaired(
    two_tier: mouthguard.Store,
) -> None:
    ckpt = _protected(two_tier, 2)
    rank = Path(two_tier.tier("durable").location("r/000000000001/")) / "rank-00000.safetensors"
    flip_byte(rank, 5000)  # silent: the receipt still says "verified"
    assert ckpt.info(1).state == "protected"  # type: ignore[union-attr]
    report = scrub(two_tier, max_age_seconds=0, now=time.time() + 1)
    assert [(r.step, r.tier) for r in report.damaged] == [(1, "durable")]
    assert sum(r.ok for r in report.results) == 3
    assert ckpt.info(1).state != "protected"  # type: ignore[union-attr]
    Replicator(two_tier).run_once()
    assert ckpt.info(1).state == "protected"  # type: ignore[union-attr]
    assert scrub(two_tier, max_age_seconds=0, now=time.time() + 1).damaged == []


def test_budget_bounds_a_pass_oldest_first(two_tier: mouthguard.Store) -> None:
    _protected(two_tier, 3)
    one_copy = mouthguard.Checkpointer(two_tier, run="r", background=False).info(1).nbytes  # type: ignore[union-attr]
    report = scrub(two_tier, max_age_seconds=0, budget_bytes=2 * one_copy, now=time.time() + 1)
    assert len(report.results) == 2 and all(r.ok for r in report.results)
