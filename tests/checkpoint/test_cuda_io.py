"""Saving from and loading into GPU memory through the pinned ring (skipped without CUDA).

CI has no GPU; these run on a GPU machine. Every comparison is bitwise, against
values kept on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint import reader, writer
from tests.checkpoint.helpers import flip_byte

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _expected() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(700, 300, generator=gen),
        "h": torch.randn(1001, generator=gen).half(),
        "i": torch.randint(-9, 9, (33,), generator=gen),
        "t": torch.randn(40, 64, generator=gen).t(),  # not contiguous
        "e": torch.empty(0, 3),
        "b": torch.rand(17, generator=gen) > 0.5,
    }


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many chunks per tensor: the ring wraps around many times within and across tensors.
    monkeypatch.setattr(writer, "WRITE_CHUNK_BYTES", 4096)
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", 4096)


@pytest.mark.usefixtures("small_chunks")
def test_a_sync_save_from_the_gpu_and_a_load_onto_it_round_trip(tmp_path: Path) -> None:
    expected = _expected()
    ckpt = mouthguard.Checkpointer(tmp_path / "s", run="r", background=False)
    ckpt.save(1, {k: v.cuda() for k, v in expected.items()})
    on_cpu = ckpt.load(1).state
    assert isinstance(on_cpu, dict)
    for name, tensor in expected.items():
        assert torch.equal(on_cpu[name], tensor), name
    on_gpu = ckpt.load(1, device="cuda").state
    assert isinstance(on_gpu, dict)
    for name, tensor in expected.items():
        assert on_gpu[name].device.type == "cuda"
        assert torch.equal(on_gpu[name].cpu(), tensor), name


@pytest.mark.usefixtures("small_chunks")
def test_load_into_gpu_tensors_fills_them_in_place_and_falls_back_on_damage(
    tmp_path: Path,
) -> None:
    expected = _expected()
    ckpt = mouthguard.Checkpointer(tmp_path / "s", run="r", background=False)
    ckpt.save(1, expected)
    ckpt.save(2, {k: torch.zeros_like(v) for k, v in expected.items()})
    flip_byte(tmp_path / "s" / "fast" / "r" / f"{2:012d}" / "rank-00000.safetensors", -5)
    into = {k: torch.full_like(v.contiguous(), 1).cuda() for k, v in expected.items()}
    pointers = {k: v.data_ptr() for k, v in into.items()}
    with pytest.warns(mouthguard.CheckpointFallbackWarning):
        loaded = ckpt.load(into=into)
    assert loaded.step == 1
    assert isinstance(loaded.state, dict)
    for name, tensor in expected.items():
        assert loaded.state[name] is into[name]
        assert into[name].data_ptr() == pointers[name]
        assert torch.equal(into[name].cpu(), tensor), name


def test_prepare_pins_the_staging_before_the_first_async_save(tmp_path: Path) -> None:
    expected = _expected()
    state = {k: v.cuda() for k, v in expected.items()}
    with mouthguard.Checkpointer(tmp_path / "s", run="r", background=False) as ckpt:
        assert not ckpt.staging_pinned
        ckpt.prepare(state)
        assert ckpt.staging_pinned
        handle = ckpt.save_async(1, state)
        for tensor in state.values():
            tensor.fill_(-1)
        handle.result(timeout=120)
        loaded = ckpt.load(1).state
        assert isinstance(loaded, dict)
        for name, tensor in expected.items():
            assert torch.equal(loaded[name], tensor), name
