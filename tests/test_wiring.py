"""wiring: a store's saves reach its background service, whose burst gate is public.

``mouthguard.burst_gate(store)`` is the gate a store's checkpointers mark busy
while they save; a dataset loader's prefetch waits on it. The prefetch test
drives the gate on a fake clock: the save "ends meanwhile" through a clock
callback that runs when the prefetcher's bounded waits reach it, so nothing
depends on how fast the machine is.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.data import StreamingDataset
from mouthguard.jobs.service import BackgroundService, service_for
from mouthguard.tiers import PutMode
from mouthguard.tiers.base import ObjectInfo, PutData
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from tests.data.helpers import expected, write_dataset
from tests.fake_clock import FakeClock


class GateWatchingTier(MemoryTier):
    """A fast tier that notes, at every put the saving thread makes, whether the gate is busy.

    Only the saver's puts: the background service, once a save committed, writes
    facts of its own to the fast tier (a sidecar), with the gate rightly idle.
    """

    gate: Any = None

    def __init__(self) -> None:
        super().__init__(name="fast", domain="node")
        self.saver = threading.current_thread()
        self.busy_at_put: list[bool] = []

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if self.gate is not None and threading.current_thread() is self.saver:
            self.busy_at_put.append(self.gate.busy)
        return super().put(key, data, mode=mode)


class HeadWatchingTier(LocalTier):
    """A dataset's tier that notes, at every head, the thread asking and the gate's state."""

    def __init__(self, root: Path, gate: Any) -> None:
        super().__init__(root, name="data", domain="local")
        self.gate = gate
        self.heads: list[tuple[str, bool]] = []
        self.prefetched = threading.Event()

    def head(self, key: str) -> ObjectInfo:
        thread = threading.current_thread().name
        self.heads.append((thread, self.gate.busy))
        if thread == "prefetch":
            self.prefetched.set()
        return super().head(key)


def _save(store: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(store, run="r")
    assert ckpt.background  # a second tier: saves are reported to the background service
    ckpt.save(1, {"w": torch.arange(8.0)})


def test_the_default_store_gate_is_busy_while_a_checkpointer_saves() -> None:
    fast = GateWatchingTier()
    store = mouthguard.Store([fast, MemoryTier(name="durable", domain="remote")])
    gate = mouthguard.burst_gate(store)
    try:
        assert gate is mouthguard.burst_gate(store)  # one gate per store
        assert gate is service_for(store, start=False).gate  # the one replication yields to
        fast.gate = gate
        assert not gate.busy
        _save(store)
        assert fast.busy_at_put and all(fast.busy_at_put)  # every write of the save
        assert not gate.busy  # and not after it
    finally:
        service_for(store, start=False).stop()


def test_a_store_with_its_own_listener_has_no_gate_to_hand_out() -> None:
    class Quiet:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

    def listener(store: mouthguard.Store) -> CheckpointListener:
        return Quiet()  # type: ignore[return-value]

    store = mouthguard.Store([MemoryTier(name="fast", domain="node")], listener=listener)
    with pytest.raises(ValueError, match="no burst gate"):
        mouthguard.burst_gate(store)


@pytest.mark.timeout(120)  # a prefetcher that never yields or never resumes would hang
def test_a_prefetching_dataset_waits_while_a_save_holds_the_gate(tmp_path: Path) -> None:
    clock = FakeClock()
    services: dict[str, BackgroundService] = {}

    def listener(store: mouthguard.Store) -> CheckpointListener:
        return services.setdefault("service", BackgroundService(store, clock=clock))

    fast = GateWatchingTier()
    store = mouthguard.Store([fast, MemoryTier(name="durable", domain="remote")], listener=listener)
    gate = mouthguard.burst_gate(store)
    assert gate.clock is clock
    fast.gate = gate
    _save(store)
    assert all(fast.busy_at_put) and not gate.busy

    n = 40
    write_dataset(tmp_path, n=n)  # several shards
    tier = HeadWatchingTier(tmp_path, gate)
    dataset = StreamingDataset(tier, prefix="ds", prefetch=2, burst=gate)
    gate.save_started()  # a save in flight, as the checkpointer marks it
    ended = threading.Event()

    def save_ends() -> None:
        gate.save_finished()
        ended.set()

    clock.call_later(3.0, save_ends)  # fake seconds: reached only through the waits
    samples = iter(dataset)
    # The consumer never waits for a burst. The blocks after the first are announced
    # to the prefetcher once the first sample is out, as the second is asked for.
    first = [next(samples)["__key__"], next(samples)["__key__"]]
    assert ended.wait(60), "the prefetcher never waited on the gate"
    assert tier.prefetched.wait(60), "the prefetcher did not resume after the save"
    keys = [*first, *(s["__key__"] for s in samples)]
    assert keys == sorted(expected(n))
    assert clock.waited, "the prefetcher polled the gate"
    prefetches = [busy for thread, busy in tier.heads if thread == "prefetch"]
    assert prefetches and not any(prefetches), "no prefetch while the save was in flight"
