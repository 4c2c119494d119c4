"""The per-node bound on range requests in flight: real processes, real flocks, a real loader."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mouthguard
from mouthguard.data import StreamingDataset
from mouthguard.data.fetching.nodeslots import NodeSlots
from mouthguard.tiers import Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.wrapper import WrappedTier

from ..helpers import expected, write_dataset

SRC = Path(mouthguard.__file__).resolve().parents[1]

#: A holder: takes a slot THREADS times on each of THREADS threads, logs "+" once it
#: holds one and "-" just before it lets go (O_APPEND: each write lands whole, in order).
HOLDER = """
import os, sys, threading, time
from mouthguard.data.fetching.nodeslots import NodeSlots
directory, count, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
slots = NodeSlots(directory, count)
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def work():
    for _ in range(4):
        with slots.held(timeout=60):
            os.write(fd, b"+")
            time.sleep(0.02)
            os.write(fd, b"-")
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
"""

SLEEPER = """
import sys, time
from mouthguard.data.fetching.nodeslots import NodeSlots
with NodeSlots(sys.argv[1], 1).held(timeout=60):
    print("held", flush=True)
    time.sleep(120)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}  # the child imports this checkout


def test_processes_never_hold_more_slots_than_the_node_allows(tmp_path: Path) -> None:
    log = tmp_path / "log"
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "slots"), "3", str(log)], env=_env()
        )
        for _ in range(3)
    ]
    for holder in holders:
        assert holder.wait(timeout=120) == 0
    events = log.read_bytes()
    assert events.count(b"+") == events.count(b"-") == 3 * 3 * 4
    held, peak = 0, 0
    for event in events:
        held += 1 if event == ord("+") else -1
        peak = max(peak, held)
    assert peak <= 3


def test_a_killed_holder_frees_its_slot(tmp_path: Path) -> None:
    slots = NodeSlots(tmp_path / "slots", 1)
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(tmp_path / "slots")],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="all 1 request slots"), slots.held(timeout=0.05):
            pass
    finally:
        child.kill()
        child.wait(timeout=60)
    with slots.held(timeout=60):  # the kernel dropped the dead child's lock
        pass


def test_a_bad_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        NodeSlots(tmp_path, 0)
    with pytest.raises(ValueError, match="node_requests"):
        StreamingDataset(tmp_path, node_requests=0)


class OverlapTier(WrappedTier):
    """Records the most shard reads in progress at once."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.now = 0
        self.peak = 0
        self._lock = threading.Lock()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if not key.endswith(".tar"):
            return self.inner.get(key, start, end)
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            return self.inner.get(key, start, end)
        finally:
            with self._lock:
                self.now -= 1


def test_two_loaders_sharing_a_cache_keep_to_the_node_bound(tmp_path: Path) -> None:
    """Two datasets (as two ranks' workers) on one cache, 4 reads each allowed, 2 per node."""
    write_dataset(tmp_path, n=600, shard_size=256 * 1024, range_size=64 * 1024)
    slow = FaultPlan(delay=1.0, delay_seconds=0.01, ops=frozenset({"get"}), keys=".tar")
    tier = OverlapTier(FaultyTier(LocalTier(tmp_path), slow, seed=1))
    got: list[list[str]] = [[], []]

    def read(i: int) -> None:
        stream = StreamingDataset(
            tier,
            prefix="ds",
            cache_dir=tmp_path / "cache",
            shuffle=True,
            seed=i,
            range_parallel=4,
            node_requests=2,
        )
        got[i] = [s["__key__"] for s in stream]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(sorted(keys) == sorted(expected(600)) for keys in got)
    assert 1 <= tier.peak <= 2


def _live_until(ready: object, release: object) -> None:
    ready.set()  # type: ignore[attr-defined]
    release.wait(30)  # type: ignore[attr-defined]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads running
def test_a_worker_forked_during_a_request_does_not_keep_its_slot(tmp_path: Path) -> None:
    slots = NodeSlots(tmp_path / "slots", 1)
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_live_until, args=(ready, release))
    try:
        with slots.held(timeout=5):
            child.start()
            assert ready.wait(30)  # the child runs: its fork handlers have run
        # the request ended: the node's only slot is free, though the child lives on
        with slots.held(timeout=5):
            pass
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0
