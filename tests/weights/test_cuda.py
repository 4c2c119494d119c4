"""weights.load straight into GPU memory (skipped without CUDA; CI has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard import weights
from mouthguard.errors import ChecksumMismatchError
from tests.checkpoint.helpers import flip_byte
from tests.weights.helpers import assert_equal, model_state, write_sharded

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TP_RULES = (("*.q_proj.weight", 0), ("*.o_proj.weight", 1))


@pytest.mark.parametrize("slot_bytes", [4096, 1 << 24])
def test_an_hf_directory_loads_onto_the_gpu(tmp_path: Path, slot_bytes: int) -> None:
    state = model_state()
    loaded = weights.load(write_sharded(tmp_path / "m", state), "cuda", slot_bytes=slot_bytes)
    assert loaded.device.startswith("cuda")
    assert all(t.device.type == "cuda" for t in loaded.tensors.values())
    assert_equal(loaded.tensors, state)


def test_a_checkpoint_loads_onto_the_gpu_verified(tmp_path: Path) -> None:
    state = {"w": torch.randn(1000, 300), "h": torch.randn(77).half()}
    mouthguard.Checkpointer(tmp_path / "s", run="r", background=False).save(1, state)
    loaded = weights.load(tmp_path / "s", "cuda", run="r", slot_bytes=64 * 1024)
    assert loaded.verified_files == ["rank-00000.safetensors"]
    assert_equal(loaded.tensors, state)
    flip_byte(tmp_path / "s" / "fast" / "r" / f"{1:012d}" / "rank-00000.safetensors", -2)
    with pytest.raises(ChecksumMismatchError):
        weights.load(tmp_path / "s", "cuda", run="r")


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_slices_land_on_the_gpu(tmp_path: Path, rank: int) -> None:
    state = model_state()
    tp = weights.TensorParallel(rank, 2, TP_RULES)
    loaded = weights.load(write_sharded(tmp_path / "m", state), "cuda", tensor_parallel=tp)
    for name, tensor in state.items():
        dim = 0 if name.endswith("q_proj.weight") else 1 if name.endswith("o_proj.weight") else None
        want = tensor if dim is None else tensor.chunk(2, dim)[rank]
        assert torch.equal(loaded.tensors[name].cpu(), want), name
