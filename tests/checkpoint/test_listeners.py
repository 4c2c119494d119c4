"""What the checkpoint layer tells the store's listener, and when (without importing jobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.staging import snapshot as real_snapshot
from mouthguard.checkpoint.store import Store, install_default_listener
from mouthguard.errors import FormatError
from mouthguard.tiers.local import LocalTier
from tests.checkpoint.helpers import RecordingListener as Recorder
from tests.checkpoint.helpers import flip_byte


def _store(root: Path, recorder: Recorder, tiers: int = 2) -> Store:
    names = ["fast", "durable"][:tiers]
    return Store(
        [LocalTier(root / n, name=n, domain=n) for n in names], listener=lambda _s: recorder
    )


def test_a_save_is_bracketed_then_announced_as_a_commit(tmp_path: Path) -> None:
    recorder = Recorder()
    ckpt = mouthguard.Checkpointer(_store(tmp_path, recorder), run="r")
    ckpt.announce(5.0, 1024)
    ckpt.save(1, {"w": torch.ones(3)})
    ckpt.save_async(2, {"w": torch.ones(3)}).result()
    assert ckpt.wait_replicated(timeout=1.0)
    assert recorder.events == [
        ("announce", 5.0, 1024),
        ("started",),
        ("finished",),
        ("commit", "r", 1),
        ("started",),
        ("finished",),
        ("commit", "r", 2),
        ("wait", 1.0),
    ]


def test_a_failed_save_still_finishes_its_burst(tmp_path: Path) -> None:
    recorder = Recorder()
    ckpt = mouthguard.Checkpointer(_store(tmp_path, recorder), run="r")
    ckpt.save(1, {"w": torch.ones(3)})
    recorder.events.clear()
    with pytest.raises(mouthguard.MouthguardError):
        ckpt.save(1, {"w": torch.ones(3)})  # the step exists
    assert recorder.events == [("started",), ("finished",)]


def test_damage_found_by_load_is_a_repair_not_a_commit(tmp_path: Path) -> None:
    recorder = Recorder()
    store = _store(tmp_path, recorder, tiers=1)
    ckpt = mouthguard.Checkpointer(store, run="r", background=True)
    ckpt.save(1, {"w": torch.ones(3)})
    ckpt.save(2, {"w": torch.ones(3)})
    recorder.events.clear()
    flip_byte(tmp_path / "fast" / "r" / f"{2:012d}" / "rank-00000.safetensors", -1)
    with pytest.warns(mouthguard.CheckpointFallbackWarning):
        assert ckpt.load().step == 1
    assert recorder.events == [("repair", "r", 2)]


def test_background_off_tells_no_one(tmp_path: Path) -> None:
    recorder = Recorder()
    ckpt = mouthguard.Checkpointer(_store(tmp_path, recorder), run="r", background=False)
    ckpt.announce(1.0, 1)
    ckpt.save(1, {"w": torch.ones(3)})
    assert not ckpt.wait_replicated(timeout=0.0)  # two tiers, nobody replicating
    assert recorder.events == []


@pytest.fixture
def no_default() -> Iterator[None]:
    previous = install_default_listener(None)
    try:
        yield
    finally:
        install_default_listener(previous)


@pytest.mark.usefixtures("no_default")
def test_without_any_listener_saves_tell_no_one(tmp_path: Path) -> None:
    store = Store([LocalTier(tmp_path / n, name=n, domain=n) for n in ("fast", "durable")])
    assert store.listener() is None
    ckpt = mouthguard.Checkpointer(store, run="r")
    assert ckpt.background  # it would tell, but nobody listens
    ckpt.save(1, {"w": torch.ones(3)})
    assert not ckpt.wait_replicated(timeout=0.0)


def test_the_default_listener_serves_every_store_made_without_one(tmp_path: Path) -> None:
    recorder = Recorder()
    previous = install_default_listener(lambda _s: recorder)
    try:
        store = mouthguard.open_store(tmp_path / "store")
        mouthguard.Checkpointer(store, run="r").save(1, {"w": torch.ones(3)})
    finally:
        install_default_listener(previous)
    assert ("commit", "r", 1) in recorder.events


def test_an_async_save_s_burst_begins_before_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Background jobs must already be paused while the training loop waits for the
    # snapshot, not only once the background write starts.
    recorder = Recorder()

    def snapshot(*args: Any) -> None:
        recorder.events.append(("snapshot",))
        real_snapshot(*args)

    monkeypatch.setattr("mouthguard.checkpoint.saving.snapshot", snapshot)
    ckpt = mouthguard.Checkpointer(_store(tmp_path, recorder), run="r")
    ckpt.save_async(1, {"w": torch.ones(3)}).result()
    assert recorder.events == [("started",), ("snapshot",), ("finished",), ("commit", "r", 1)]


def test_a_failed_snapshot_still_finishes_its_burst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()

    def snapshot(*_args: Any) -> None:
        raise FormatError("tensor changed size while being saved")

    monkeypatch.setattr("mouthguard.checkpoint.saving.snapshot", snapshot)
    ckpt = mouthguard.Checkpointer(_store(tmp_path, recorder), run="r")
    with pytest.raises(FormatError):
        ckpt.save_async(1, {"w": torch.ones(3)})
    assert recorder.events == [("started",), ("finished",)]
    assert not ckpt.exists(1)
