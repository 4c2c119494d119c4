"""PreemptionGuard: SIGTERM in a real process -> one consistent checkpoint, clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mouthguard

ROOT = Path(__file__).parents[2]


def _start(
    store: Path, step_seconds: float, grace: float = 5.0, *, mask_main: bool = False
) -> subprocess.Popen[str]:
    args = [str(store), str(step_seconds), str(grace), *(["mask-main"] if mask_main else [])]
    return subprocess.Popen(  # our own interpreter and module
        [sys.executable, "-m", "tests.checkpoint.preempt_child", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
def test_sigterm_saves_the_newest_consistent_state_and_exits_cleanly(tmp_path: Path) -> None:
    store = tmp_path / "store"
    child = _start(store, step_seconds=0.01)
    try:
        assert child.stdout is not None
        seen = 0
        for line in child.stdout:
            seen = int(line.split()[1])
            if seen >= 20:
                break
        child.send_signal(signal.SIGTERM)
        rest = child.stdout.read()
        code = child.wait(timeout=60)
    finally:
        child.kill()
    assert code == 0
    last = max([seen, *(int(line.split()[1]) for line in rest.splitlines() if line)])
    ckpt = mouthguard.Checkpointer(store, run="job", background=False)
    (info,) = ckpt.list()
    assert info.step == last  # the step it was on when it noticed, no later and no earlier
    assert info.importance is mouthguard.Importance.MILESTONE
    state = ckpt.load().state
    assert isinstance(state, dict)
    assert state["step"] == last and torch.equal(state["w"], torch.full((64,), float(last)))


def test_without_sigterm_the_guard_does_nothing(tmp_path: Path) -> None:
    from mouthguard.checkpoint.emergency import PreemptionGuard  # noqa: PLC0415

    ckpt = mouthguard.Checkpointer(tmp_path / "s", run="r", background=False)
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionGuard(ckpt, lambda: (1, {"x": 1})) as guard:
        assert signal.getsignal(signal.SIGTERM) is not before
        guard.at_step_boundary()
        assert not guard.requested
    assert signal.getsignal(signal.SIGTERM) is before
    assert ckpt.list() == []


@pytest.mark.slow
def test_a_step_longer_than_the_grace_ends_the_process_without_a_save(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # A step of an hour: only the grace watchdog can end the process within the wait below.
    child = _start(store, step_seconds=3600.0, grace=0.5)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # step 1 has begun: its hour-long work is under way
        child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=60)
    finally:
        child.kill()
    assert code == 128 + signal.SIGTERM  # the watchdog's exit, not the loop's
    assert mouthguard.Checkpointer(store, run="job", background=False).list() == []


@pytest.mark.slow
def test_the_watchdog_ends_the_process_when_sigterm_lands_on_another_thread(
    tmp_path: Path,
) -> None:
    """The main thread blocked in C never runs Python's handler; the watchdog still fires.

    The child blocks SIGTERM in its main thread, so the kernel hands it to another
    thread (as it may hand it to one of torch's): only the wakeup-fd listener sees it.
    """
    store = tmp_path / "store"
    child = _start(store, step_seconds=3600.0, grace=0.5, mask_main=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()
        child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=60)
    finally:
        child.kill()
    assert code == 128 + signal.SIGTERM
    assert mouthguard.Checkpointer(store, run="job", background=False).list() == []
