"""SIGKILL in the middle of saves, in a real subprocess: nothing half-written is ever accepted.

The child (:mod:`tests.checkpoint.crash_child`) freezes a save at a chosen point
of the commit protocol and says so; the parent then kills it. Every point is
hit once, in a seeded order, so what the test proves does not depend on timing.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mouthguard
from tests.checkpoint.crash_child import COMMITTED, POINTS, RUN, state_for
from tests.checkpoint.helpers import assert_same

ROOT = Path(__file__).parents[2]


def _run_until_frozen(store: Path, start: int, saves: int, point: str) -> tuple[list[int], int]:
    """Start a child, SIGKILL it once its save froze at ``point``: (acked steps, frozen step)."""
    args = [str(store), str(start), str(saves), point]
    child = subprocess.Popen(  # our own interpreter and module
        [sys.executable, "-m", "tests.checkpoint.crash_child", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        cwd=ROOT,
    )
    acked: list[int] = []
    frozen: int | None = None
    lines: list[str] = []
    assert child.stdout is not None
    try:
        for line in child.stdout:
            lines.append(line)
            kind, step, *_ = [*line.split(), "", ""]
            if kind == "acked":
                acked.append(int(step))
            elif kind == "paused":
                frozen = int(step)
                break  # frozen until killed: nothing else can happen in the save
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
    assert frozen is not None, f"no freeze at {point} (exit {child.returncode}): {lines}"
    return acked, frozen


@pytest.mark.slow
def test_sigkill_during_save_never_leaves_an_accepted_partial(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    run_dir = store_dir / "fast" / RUN
    rng = random.Random(1234)
    points = list(POINTS)
    rng.shuffle(points)
    committed: list[int] = []
    for point in points:
        start = max(committed, default=-1) + 1
        saves = rng.randint(1, 3)
        acked, frozen = _run_until_frozen(store_dir, start, saves, point)
        assert acked == list(range(start, start + saves))
        assert frozen == start + saves
        committed += acked
        if point == COMMITTED:
            # Renamed into place before the kill: committed, though never acknowledged.
            committed.append(frozen)
        else:
            # Killed before the commit: its staging is left behind, never visible.
            assert point == "before-rank-file" or list(run_dir.glob(f"{frozen:012d}.partial-*"))
        ckpt = mouthguard.Checkpointer(store_dir, run=RUN, background=False)
        # Every acknowledged save is there, and nothing that was not committed.
        assert [info.step for info in ckpt.list()] == committed, point
        # Everything that list() accepts is byte-exact.
        for step in committed:
            assert_same(ckpt.load(step).state, state_for(step))
        assert ckpt.load().step == committed[-1]
    # Leftovers are collected once older than the grace period, committed data untouched.
    ckpt = mouthguard.Checkpointer(store_dir, run=RUN, background=False)
    leftovers = sorted(run_dir.glob("*.partial-*"))
    assert leftovers  # the kills before the commit left their staging behind
    young = ckpt.collect_garbage(grace_seconds=3600)
    assert all(r.partial_saves == [] and r.incomplete_objects == 0 for r in young)
    assert sorted(run_dir.glob("*.partial-*")) == leftovers
    old = ckpt.collect_garbage(grace_seconds=0)
    assert sum(r.incomplete_objects + len(r.partial_saves) for r in old) >= len(leftovers)
    assert not list(run_dir.glob("*.partial-*"))
    assert not list(run_dir.rglob(".tmp-*"))
    assert [i.step for i in ckpt.list()] == committed
    assert torch.equal(ckpt.load().state["w"], state_for(committed[-1])["w"])  # type: ignore[index]
