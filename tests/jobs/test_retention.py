"""Retention applied to a real store: through the trash, never the protected ones."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import mouthguard
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention

DAY = 86400.0


def _fill(
    store: mouthguard.Store, steps: range, importance: str = "routine"
) -> mouthguard.Checkpointer:
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    for step in steps:
        ckpt.save(step, {"w": torch.full((64,), float(step))}, importance=importance)
    Replicator(store).run_once()
    return ckpt


def _steps(ckpt: mouthguard.Checkpointer) -> list[int]:
    return [i.step for i in ckpt.list()]


def test_old_routine_checkpoints_go_through_the_trash(two_tier: mouthguard.Store) -> None:
    ckpt = _fill(two_tier, range(1, 7))
    now = time.time()
    first = apply_retention(two_tier, now=now)
    # Default: keep the last 3 routine saves; older ones are trashed on both tiers.
    trashed = {
        (a.step, a.action.tier) for a in first.actions if a.action.action == "trash" and a.done
    }
    assert trashed == {(s, t) for s in (1, 2, 3) for t in ("fast", "durable")}
    assert _steps(ckpt) == [1, 2, 3, 4, 5, 6]  # trashed, not yet gone
    reasons = {d.step: d.reasons for d in first.decisions}
    assert any("last 3" in r for r in reasons[4])
    # Before the delay: nothing is purged, the marks are not renewed.
    again = apply_retention(two_tier, now=now + DAY / 2)
    assert again.count("purge") == 0 and again.count("trash") == 0
    # After the delay: purged everywhere, manifest first (nothing half-visible).
    late = apply_retention(two_tier, now=now + DAY + 1)
    assert late.count("purge") == 6
    assert _steps(ckpt) == [4, 5, 6]
    for tier in ("fast", "durable"):
        run_dir = Path(two_tier.tier(tier).location("r/"))
        assert sorted(p.name for p in run_dir.iterdir()) == [f"{s:012d}" for s in (4, 5, 6)]


def test_dry_run_changes_nothing(two_tier: mouthguard.Store) -> None:
    ckpt = _fill(two_tier, range(1, 6))
    report = apply_retention(two_tier, now=time.time() + 10 * DAY, dry_run=True)
    assert report.count("trash") == 4  # steps 1 and 2 on both tiers
    assert all(not a.done for a in report.actions)
    assert all(c.trashed_at is None for i in ckpt.list() for c in i.copies)


def test_holds_critical_and_the_newest_valid_survive(two_tier: mouthguard.Store) -> None:
    ckpt = _fill(two_tier, range(1, 8))
    ckpt.hold(1, "legal")
    ckpt.set_importance(2, "critical")
    now = time.time()
    apply_retention(two_tier, now=now)
    apply_retention(two_tier, now=now + 2 * DAY)
    assert _steps(ckpt) == [1, 2, 5, 6, 7]
    decisions = {
        d.step: d for d in apply_retention(two_tier, now=now + 3 * DAY, dry_run=True).decisions
    }
    assert any("held" in r for r in decisions[1].reasons)
    assert any("never auto-deleted" in r for r in decisions[2].reasons)


def test_a_hold_placed_after_trashing_lifts_the_mark(two_tier: mouthguard.Store) -> None:
    ckpt = _fill(two_tier, range(1, 5))
    now = time.time()
    apply_retention(two_tier, now=now)
    info = ckpt.info(1)
    assert info is not None and all(c.trashed_at is not None for c in info.copies)
    ckpt.hold(1, "investigation")
    apply_retention(two_tier, now=now + 2 * DAY)
    info = ckpt.info(1)
    assert info is not None and all(c.trashed_at is None for c in info.copies)
    assert 1 in _steps(ckpt)


def test_every_action_waits_for_the_pause_first(two_tier: mouthguard.Store) -> None:
    # The background service passes its burst gate's wait: no trash mark, purge or
    # demotion re-read is made while a save is in flight.
    ckpt = _fill(two_tier, range(1, 6))
    marks_when_paused: list[int] = []

    def pause() -> None:
        marks_when_paused.append(
            sum(c.trashed_at is not None for i in ckpt.list() for c in i.copies)
        )

    report = apply_retention(two_tier, now=time.time(), pause=pause)
    assert report.count("trash") == 4
    # One pause before each action, every one before that action's mark was made.
    assert len(marks_when_paused) == len(report.actions)
    done = [a.done for a in report.actions]
    assert marks_when_paused == [sum(done[:i]) for i in range(len(done))]
    # A dry run acts on nothing and so never waits.
    assert apply_retention(two_tier, now=time.time(), dry_run=True, pause=pause).actions
    assert len(marks_when_paused) == len(report.actions)


def test_a_pass_that_would_delete_most_of_a_run_is_refused(two_tier: mouthguard.Store) -> None:
    ckpt = _fill(two_tier, range(1, 9))  # keep-last 3: steps 1-5 would go (5 of 8)
    report = apply_retention(two_tier, now=time.time())
    (refusal,) = report.refused
    assert [d.step for d in refusal.would_delete] == [1, 2, 3, 4, 5]
    assert "5 of the run's 8 checkpoints" in refusal.why
    assert report.count("trash") == 0
    assert all(c.trashed_at is None for i in ckpt.list() for c in i.copies)
    forced = apply_retention(two_tier, now=time.time(), force=True)
    assert not forced.refused and forced.count("trash") == 10  # 5 steps x 2 tiers
