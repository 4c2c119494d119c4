"""Checkpoint bursts reach DataLoader workers through a shared flag."""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path
from typing import Any

from mouthguard.data import BurstSignal, StreamingDataLoader, StreamingDataset
from mouthguard.data.burst import SharedBurst
from mouthguard.jobs.burst import BurstGate

from .helpers import expected, write_dataset


class Switch:
    """A burst signal switched by the test."""

    def __init__(self) -> None:
        self.on = threading.Event()

    @property
    def busy(self) -> bool:
        return self.on.is_set()

    def wait(self, timeout: float) -> float:
        return 0.0 if self.on.wait(0) else timeout


def _child_sees(shared: SharedBurst, pipe: Any) -> None:
    pipe.send(shared.busy)
    pipe.recv()  # the parent ends the burst
    pipe.send(shared.wait(30.0) < 30.0 and not shared.busy)


def test_the_store_gate_is_a_burst_signal() -> None:
    assert isinstance(BurstGate(), BurstSignal)  # what users pass: the store's own gate


def test_a_worker_process_sees_the_main_process_burst() -> None:
    switch = Switch()
    switch.on.set()
    shared = SharedBurst(switch)
    try:
        while not shared.busy:  # the mirror thread's first poll
            threading.Event().wait(0.01)
        ours, theirs = mp.get_context("fork").Pipe()
        child = mp.get_context("fork").Process(target=_child_sees, args=(shared, theirs))
        child.start()
        assert ours.recv() is True
        switch.on.clear()
        ours.send("go")
        assert ours.recv() is True  # its wait ended once the burst did
        child.join(30)
    finally:
        shared.stop()
    assert not shared.busy


def test_a_loader_with_workers_and_a_burst_delivers_everything(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=30)
    switch = Switch()
    switch.on.set()  # a burst that lasts the whole epoch: prefetch yields, consumers do not
    dataset = StreamingDataset(
        tmp_path / "ds", batch_size=2, cache_dir=tmp_path / "cache", burst=switch
    )
    keys = [k for b in StreamingDataLoader(dataset, num_workers=2) for k in b["__key__"]]
    assert sorted(keys) == sorted(expected(30))
    assert dataset.burst is switch  # the shared mirror was only for the workers
