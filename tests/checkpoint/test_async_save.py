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


class _GatedTier(LocalTier):
    """A local tier whose rank-file writes wait until ``opened`` is set.

    A save is then certainly still in flight until the test opens the gate,
    however fast or slow the machine is.
    """

    def __init__(self, root: Path, opened: threading.Event) -> None:
        super().__init__(root)
        self.opened = opened

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if key.endswith(".safetensors") and not self.opened.wait(timeout=60):
            raise TierError(f"the test never opened the gate for {key!r}")
        return super().put(key, data, mode=mode)


def _gated(tmp_path: Path) -> tuple[mouthguard.Checkpointer, threading.Event]:
    opened = threading.Event()
    store = mouthguard.Store([_GatedTier(tmp_path / "fast", opened)])
    return mouthguard.Checkpointer(store, run="r", background=False), opened


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
    assert not ckpt.staging_pinned  # CPU tensors: an ordinary page-aligned buffer


def test_handle_reports_progress_and_completion(tmp_path: Path) -> None:
    ckpt, opened = _gated(tmp_path)
    handle = ckpt.save_async(1, {"w": torch.randn(512, 1024)})
    assert isinstance(handle, SaveHandle)
    assert not handle.done()  # held at the gate
    assert handle.wait(timeout=0.01) is False
    with pytest.raises(TimeoutError, match="still running"):
        handle.result(timeout=0.01)
    opened.set()
    assert handle.wait(timeout=60) is True
    assert handle.done()
    assert ckpt.steps() == [1]


def test_a_new_save_waits_for_the_one_in_flight(tmp_path: Path) -> None:
    ckpt, opened = _gated(tmp_path)
    first = ckpt.save_async(1, {"w": torch.randn(256, 1024)})
    assert not first.done()  # held at the gate
    returned: list[tuple[SaveHandle, bool]] = []

    def second_save() -> None:
        handle = ckpt.save_async(2, {"w": torch.randn(256, 1024)})
        returned.append((handle, first.done()))

    caller = threading.Thread(target=second_save)
    caller.start()
    caller.join(timeout=0.2)
    # Backpressure: while the first save is held, the second call cannot return.
    assert caller.is_alive() and returned == []
    opened.set()
    caller.join(timeout=60)
    ((second, first_done_on_return),) = returned
    assert first_done_on_return  # its snapshot began only after the first save finished
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
    staging = ckpt._saves.saver.staging
    capacity = staging.capacity
    pointer = staging.reserve(1, pinned=False).data_ptr()
    for step in range(2, 6):
        ckpt.save_async(step, state).result(timeout=60)
        assert staging.capacity == capacity
        assert staging.reserve(1, pinned=False).data_ptr() == pointer
    ckpt.close()
    assert staging.capacity == 0


def test_prepare_reserves_the_staging_the_first_save_then_uses(
    ckpt: mouthguard.Checkpointer,
) -> None:
    state = _state()
    staging = ckpt._saves.saver.staging
    assert staging.capacity == 0
    reserved = ckpt.prepare(state)
    assert reserved >= sum(t.numel() * t.element_size() for t in _tensors(state))
    capacity = staging.capacity
    pointer = staging.reserve(1, pinned=False).data_ptr()
    ckpt.save_async(1, state).result(timeout=60)
    # The first save snapshotted into the prepared buffer: nothing allocated in its stall.
    assert staging.capacity == capacity
    assert staging.reserve(1, pinned=False).data_ptr() == pointer
    assert_same(ckpt.load(1).state, state)
    assert ckpt.prepare(state) == reserved  # again: same buffer, nothing regrown
    assert staging.reserve(1, pinned=False).data_ptr() == pointer


def test_prepare_refuses_state_that_needs_pickle(ckpt: mouthguard.Checkpointer) -> None:
    with pytest.raises(UnsupportedStateError):
        ckpt.prepare({"w": torch.ones(3), "bad": object()})
    assert ckpt._saves.saver.staging.capacity == 0


def _tensors(state: object) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _tensors(v)]
    return []


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
        import threading, torch, mouthguard
        from mouthguard.tiers.local import LocalTier
        from mouthguard.tiers.throttle import ThrottledTier

        opened = threading.Event()

        class Gated(LocalTier):
            def put(self, key, data, *, mode):
                if key.endswith(".safetensors"):
                    assert opened.wait(60), "never opened"
                return super().put(key, data, mode=mode)

        slow = ThrottledTier(Gated({str(tmp_path / "t")!r}), 4e6)
        ckpt = mouthguard.Checkpointer(mouthguard.Store([slow]), run="r", background=False)
        handle = ckpt.save_async(9, {{"w": torch.arange(300_000, dtype=torch.float32)}})
        assert not handle.done()  # held at the gate
        opened.set()  # ~0.3 s of paced writing left as the interpreter exits
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


def _queue_a_long_run_of_work() -> None:
    """Queue a long run of matmuls (about a second on a GPU) on the current CUDA stream.

    Copies queued after it on the same stream wait for it, so a snapshot that
    returned without synchronising would still have its copies pending.
    """
    a = torch.rand(4096, 4096, device="cuda")
    out = torch.empty_like(a)
    for _ in range(400):
        torch.mm(a, a, out=out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stream", ["default", "side"])
def test_cuda_state_is_snapshotted_before_save_async_returns(
    ckpt: mouthguard.Checkpointer, stream: str
) -> None:
    """Once ``save_async`` returns, changing the CUDA tensors cannot change what is saved.

    The device-to-host copies are queued behind a long run of GPU work. Without
    the snapshot's synchronisation they would still be pending when
    ``save_async`` returns: the background writer would read a staging buffer not
    yet filled, and a write on a side stream (which does not wait for the default
    one) would land before the copies. The expected values live on the CPU, so
    they cannot be touched by either; every value written is exact in its dtype,
    and the comparison is bitwise.
    """
    gen = torch.Generator().manual_seed(0)
    expected = {
        "w": torch.randn(1024, 1024, generator=gen),
        "h": torch.randn(333, generator=gen).to(torch.bfloat16),
        "i": torch.randint(-1000, 1000, (77,), generator=gen),
        "t": torch.randn(48, 64, generator=gen),
    }
    state = {name: tensor.to("cuda") for name, tensor in expected.items()}
    state["t"] = state["t"].t()  # not contiguous: staged through a temporary on the device
    expected["t"] = expected["t"].t()
    torch.cuda.synchronize()  # the state is on the GPU before the long run of work is queued
    _queue_a_long_run_of_work()
    handle = ckpt.save_async(1, state)
    if stream == "side":
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # deliberately not waiting for the default stream
            for tensor in state.values():
                tensor.fill_(-7)
        side.synchronize()
    else:
        for tensor in state.values():
            tensor.fill_(-7)
    handle.result(timeout=120)
    assert ckpt.staging_pinned
    loaded = ckpt.load(1).state
    assert isinstance(loaded, dict) and set(loaded) == set(expected)
    for name, tensor in expected.items():
        assert loaded[name].device.type == "cpu"
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert all(torch.equal(t.cpu(), torch.full_like(t, -7).cpu()) for t in state.values())
    ckpt.close()
    assert not ckpt.staging_pinned
