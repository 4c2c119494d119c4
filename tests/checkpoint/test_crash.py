"""SIGKILL in the middle of saves, in a real subprocess: nothing half-written is ever accepted."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import mouthguard
from tests.checkpoint.crash_child import state_for
from tests.checkpoint.helpers import assert_same

KILLS = 6


def _run_until_killed(store: Path, start: int, rng: random.Random) -> tuple[set[int], int | None]:
    """SIGKILL the child just after a "saving" line; return acked steps and the one in flight."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint.crash_child", str(store), str(start)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    acked: set[int] = set()
    in_flight: int | None = None

    def record(line: str) -> None:
        nonlocal in_flight
        words = line.split()
        if len(words) != 2 or not words[1].isdigit():
            return  # a line cut short by the kill acknowledges nothing
        kind, step = words
        if kind == "acked":
            acked.add(int(step))
            in_flight = None
        else:
            in_flight = int(step)

    target_saves = rng.randint(1, 3)
    deadline = time.monotonic() + 60
    assert child.stdout is not None
    try:
        for line in child.stdout:
            record(line)
            if in_flight is not None and len(acked) >= target_saves:
                time.sleep(rng.uniform(0.0, 0.02))
                break
            assert time.monotonic() < deadline, "child never reached the kill point"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # The child may have run ahead of our reading: every line it printed before it
    # died counts (an "acked" line is a real acknowledgement, whenever we read it).
    for line in child.stdout.read().splitlines():
        record(line)
    child.stdout.close()
    return acked, in_flight


@pytest.mark.slow
def test_sigkill_during_save_never_leaves_an_accepted_partial(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    rng = random.Random(1234)
    acked_all: set[int] = set()
    partial_seen = 0
    start = 0
    for _ in range(KILLS):
        acked, in_flight = _run_until_killed(store_dir, start, rng)
        acked_all |= acked
        ckpt = mouthguard.Checkpointer(store_dir, run="crash", background=False)
        listed = [info.step for info in ckpt.list()]
        # No acknowledged save is lost; the only extra step allowed is the one in flight
        # (it may have committed just before the kill).
        assert acked_all <= set(listed)
        assert set(listed) - acked_all <= ({in_flight} if in_flight is not None else set())
        # Everything that list() accepts is byte-exact.
        for step in listed:
            assert_same(ckpt.load(step).state, state_for(step))
        assert ckpt.load().step == max(listed)
        partials = list((store_dir / "fast" / "crash").glob("*.partial-*"))
        partial_seen += bool(partials)
        start = max(listed, default=start - 1) + 1
    assert partial_seen >= 1, "no kill landed inside a save; the test proved nothing"
    # Leftovers are collected once older than the grace period, committed data untouched.
    ckpt = mouthguard.Checkpointer(store_dir, run="crash", background=False)
    before = [i.step for i in ckpt.list()]
    run_dir = store_dir / "fast" / "crash"
    leftovers = sorted(run_dir.glob("*.partial-*"))
    young = ckpt.collect_garbage(grace_seconds=3600)
    assert all(r.partial_saves == [] and r.incomplete_objects == 0 for r in young)
    assert sorted(run_dir.glob("*.partial-*")) == leftovers
    old = ckpt.collect_garbage(grace_seconds=0)
    assert sum(r.incomplete_objects + len(r.partial_saves) for r in old) >= len(leftovers)
    assert not list(run_dir.glob("*.partial-*"))
    assert not list(run_dir.rglob(".tmp-*"))
    assert [i.step for i in ckpt.list()] == before
    assert torch.equal(ckpt.load().state["w"], state_for(before[-1])["w"])  # type: ignore[index]
