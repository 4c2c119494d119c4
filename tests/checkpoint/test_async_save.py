"""save_async: the snapshot is what gets saved, one save in flight, errors reach the handle."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.async_save import SaveHandle
from mouthguard.errors import CheckpointExistsError, TierError, UnsupportedStateError
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.throttle import ThrottledTier
from tests.checkpoint.helpers import assert_same


def _state(seed: int = 0) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(64, 48, generator=gen)
    return {
        "model": {"w": torch.randn(300, 200, generator=gen), "b": torch.zeros(7)},
        "odd": {
            "bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
            "bool": torch.rand(13, generator=gen) > 0.5,
            "i8": torch.randint(-100, 100, (5, 3), generator=gen, dtype=torch.int8),
            "empty": torch.empty(0, 4),
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "strided": base.t(),  # not contiguous
            "c64": torch.randn(9, dtype=torch.complex64, generator=gen),
        },
        "step": 17,
        "lr": [0.1, 0.01],
    }


def _slow_store(tmp_path: Path, rate: float) -> mouthguard.Store:
    return mouthguard.Store([ThrottledTier(LocalTier(tmp_path / "fast"), rate)])


def test_the_saved_checkpoint_is_the_state_at_the_call(ckpt: mouthguard.Checkpointer) -> None:
    state = _state()
    expected = _state()
    handle = ckpt.save_async(5, state, importance="milestone")
    # The training loop goes on at once: mutate every tensor in place.
    for group in ("model", "odd"):
        for tensor in state[group].values():  # type: ignore[attr-defined]
            if tensor.numel() and tensor.dtype != torch.bool:
                tensor.add_(1)
    info = handle.result(timeout=60)
    assert info.step == 5
    assert info.importance.value == "milestone"
    assert info.stall_seconds is not None and info.stall_seconds == handle.stall_seconds
    assert info.save_seconds is not None and info.save_seconds >= info.stall_seconds
    assert_same(ckpt.load(5).state, expected)


def test_handle_reports_progress_and_completion(tmp_path: Path) -> None:
    ckpt = mouthguard.Checkpointer(_slow_store(tmp_path, 2e6), run="r", background=False)
    handle = ckpt.save_async(1, {"w": torch.randn(512, 1024)})  # 2 MiB at 2 MB/s
    assert isinstance(handle, SaveHandle)
    assert not handle.done()
    assert handle.wait(timeout=0.01) is False
    with pytest.raises(TimeoutError, match="still running"):
        handle.result(timeout=0.01)
    assert handle.wait(timeout=60) is True
    assert handle.done()
    assert ckpt.steps() == [1]


def test_a_new_save_waits_for_the_one_in_flight(tmp_path: Path) -> None:
    ckpt = mouthguard.Checkpointer(_slow_store(tmp_path, 4e6), run="r", background=False)
    first = ckpt.save_async(1, {"w": torch.randn(256, 1024)})  # 1 MiB: ~0.25 s
    assert not first.done()
    second = ckpt.save_async(2, {"w": torch.randn(256, 1024)})
    # Backpressure: the second snapshot began only after the first save finished.
    assert first.done()
    assert second.waited_seconds > 0
    assert second.stall_seconds >= second.waited_seconds
    second.result(timeout=60)
    assert ckpt.steps() == [1, 2]


def test_sync_save_after_async_commits_in_order(tmp_path: Path) -> None:
    ckpt = mouthguard.Checkpointer(_slow_store(tmp_path, 4e6), run="r", background=False)
    first = ckpt.save_async(1, {"w": torch.randn(256, 1024)})
    info = ckpt.save(2, {"w": torch.ones(3)})
    assert first.done()
    assert info.stall_seconds == info.save_seconds
    assert ckpt.steps() == [1, 2]


def test_the_staging_buffer_is_reused_not_regrown(ckpt: mouthguard.Checkpointer) -> None:
    state = _state()
    ckpt.save_async(1, state).result(timeout=60)
    staging = ckpt._saver.staging
    capacity = staging.capacity
    pointer = staging.reserve(1, pinned=False).data_ptr()
    for step in range(2, 6):
        ckpt.save_async(step, state).result(timeout=60)
        assert staging.capacity == capacity
        assert staging.reserve(1, pinned=False).data_ptr() == pointer
    ckpt.close()
    assert staging.capacity == 0


def test_an_error_in_the_background_is_raised_by_result_and_logged(
    ckpt: mouthguard.Checkpointer, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt.save(3, {"w": torch.ones(2)})
    with caplog.at_level(logging.ERROR, logger="mouthguard.checkpoint.async_save"):
        handle = ckpt.save_async(3, {"w": torch.zeros(2)})
        assert handle.wait(timeout=60)
        with pytest.raises(CheckpointExistsError):
            handle.result()
    assert any("step 3 failed" in r.getMessage() for r in caplog.records)
    assert torch.equal(ckpt.load(3).state["w"], torch.ones(2))  # type: ignore[index]


class _FailingTier(LocalTier):
    """Fails every rank-file write half way, as a full disk would."""

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if key.endswith(".safetensors"):
            raise TierError(f"cannot write {key!r}: no space left on device (ENOSPC)")
        return super().put(key, data, mode=mode)


def test_a_failed_background_write_commits_nothing_and_the_next_save_works(
    tmp_path: Path,
) -> None:
    failing = mouthguard.Store([_FailingTier(tmp_path / "t")])
    ckpt = mouthguard.Checkpointer(failing, run="r", background=False)
    handle = ckpt.save_async(1, {"w": torch.ones(4)})
    with pytest.raises(TierError, match="no space left"):
        handle.result(timeout=60)
    assert ckpt.steps() == []
    working = mouthguard.Checkpointer(
        mouthguard.Store([LocalTier(tmp_path / "t")]), run="r", background=False
    )
    working.save_async(1, {"w": torch.ones(4)}).result(timeout=60)
    assert working.steps() == [1]


def test_state_that_needs_pickle_fails_in_the_caller(ckpt: mouthguard.Checkpointer) -> None:
    with pytest.raises(UnsupportedStateError):
        ckpt.save_async(1, {"f": threading.Lock()})
    assert ckpt.steps() == []


def test_many_saves_commit_every_step_exactly(ckpt: mouthguard.Checkpointer) -> None:
    handles = [
        ckpt.save_async(step, {"step": step, "w": torch.full((1000,), step)})
        for step in range(1, 9)
    ]
    for handle in handles:
        handle.result(timeout=60)
    for step in range(1, 9):
        loaded = ckpt.load(step).state
        assert loaded["step"] == step  # type: ignore[index]
        assert torch.equal(loaded["w"], torch.full((1000,), step))  # type: ignore[index]


def test_a_save_in_flight_at_interpreter_exit_still_commits(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import torch, mouthguard
        from mouthguard.tiers.local import LocalTier
        from mouthguard.tiers.throttle import ThrottledTier
        store = mouthguard.Store([ThrottledTier(LocalTier({str(tmp_path / "t")!r}), 4e6)])
        ckpt = mouthguard.Checkpointer(store, run="r", background=False)
        handle = ckpt.save_async(9, {{"w": torch.arange(300_000, dtype=torch.float32)}})
        assert not handle.done()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    ckpt = mouthguard.Checkpointer(
        mouthguard.Store([LocalTier(tmp_path / "t")]), run="r", background=False
    )
    loaded = ckpt.load(9).state
    assert torch.equal(loaded["w"], torch.arange(300_000, dtype=torch.float32))  # type: ignore[index]


def test_background_replication_follows_an_async_save(store: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(store, run="r")
    ckpt.save_async(1, _state()).result(timeout=60)
    assert ckpt.wait_replicated(timeout=60)
    info = ckpt.info(1)
    assert info is not None
    assert sorted(c.tier for c in info.copies) == ["durable", "fast"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_staged_in_pinned_memory(ckpt: mouthguard.Checkpointer) -> None:
    state = {"w": torch.randn(1024, 1024, device="cuda"), "b": torch.arange(10, device="cuda")}
    handle = ckpt.save_async(1, state)
    state["w"].add_(1)
    handle.result(timeout=60)
    assert ckpt._saver.staging.pinned
    loaded = ckpt.load(1).state
    assert torch.equal(loaded["w"], (state["w"] - 1).cpu())  # type: ignore[index]
    assert torch.equal(loaded["b"], state["b"].cpu())  # type: ignore[index]
