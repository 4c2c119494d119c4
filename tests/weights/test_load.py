"""weights.load on the CPU: HF directories and checkpoints, verified, sliced, refused when bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard import weights
from mouthguard.errors import ChecksumMismatchError, RankFileError, WeightsError
from mouthguard.io import host_ring
from mouthguard.weights.gds import gds_status
from mouthguard.weights.pipeline import READS_AHEAD
from tests.checkpoint.helpers import flip_byte
from tests.weights.helpers import (
    assert_equal,
    model_state,
    read_with_safetensors,
    write_sharded,
    write_single,
)

TP_RULES = (("*.q_proj.weight", 0), ("*.o_proj.weight", 1), ("*.down_proj.weight", 2))


def test_a_sharded_hf_directory_loads_as_safetensors_reads_it(tmp_path: Path) -> None:
    state = model_state()
    directory = write_sharded(tmp_path / "model", state)
    loaded = weights.load(directory)
    assert_equal(loaded.tensors, state)
    assert_equal(loaded.tensors, read_with_safetensors(directory))
    assert loaded.kind == "safetensors-index"
    assert loaded.device == "cpu"
    # Hugging Face publishes no checksums: every shard is loaded, and said to be unverified.
    assert loaded.verified_files == []
    assert sorted(loaded.unverified_files) == sorted(
        p.name for p in directory.glob("*.safetensors")
    )
    assert loaded.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    assert loaded.bytes_read == loaded.nbytes  # nothing read twice, nothing unwanted
    assert not loaded.gds and loaded.gds_reason == "the device is not a GPU"


def test_a_single_file_model_loads(tmp_path: Path) -> None:
    state = model_state(1)
    loaded = weights.load(write_single(tmp_path / "m", state))
    assert loaded.kind == "safetensors"
    assert_equal(loaded.tensors, state)


def test_include_loads_only_the_matching_tensors(tmp_path: Path) -> None:
    state = model_state()
    loaded = weights.load(write_sharded(tmp_path / "m", state), include=["*.q_proj.weight"])
    assert_equal(loaded.tensors, {n: t for n, t in state.items() if n.endswith("q_proj.weight")})
    assert loaded.bytes_read == loaded.nbytes


def test_a_tensor_of_an_unknown_dtype_fails_only_when_it_is_wanted(tmp_path: Path) -> None:
    """A model file holding a dtype mouthguard does not map (safetensors' packed ``F4``)
    beside float8 scales (``F8_E8M0``): ``include=`` skips it, and asking for it names it."""
    raw = torch.arange(64, dtype=torch.int64).to(torch.uint8)
    state = {
        "packed": raw.clone().view(torch.float4_e2m1fn_x2),
        "scales": raw.view(torch.float8_e8m0fnu),
        "model.norm.weight": torch.rand(8),
    }
    model = write_single(tmp_path / "m", state)
    loaded = weights.load(model, include=["scales", "model.norm.weight"])
    assert sorted(loaded.tensors) == ["model.norm.weight", "scales"]
    assert loaded.tensors["scales"].dtype == torch.float8_e8m0fnu
    assert torch.equal(loaded.tensors["scales"].view(torch.uint8), raw)
    assert torch.equal(loaded.tensors["model.norm.weight"], state["model.norm.weight"])
    with pytest.raises(WeightsError, match=r"'packed' \(F4\).*include="):
        weights.load(model)


@pytest.mark.parametrize("slot_bytes", [4096, 1 << 24])
def test_a_checkpoint_loads_verified_by_path_and_by_run(tmp_path: Path, slot_bytes: int) -> None:
    state = model_state()
    ckpt = mouthguard.Checkpointer(tmp_path / "store", run="sft", background=False)
    ckpt.save(7, {"model": state})
    ckpt.save(9, {"model": model_state(2)})
    step_dir = tmp_path / "store" / "fast" / "sft" / f"{7:012d}"
    by_path = weights.load(step_dir, slot_bytes=slot_bytes)
    assert by_path.kind == "checkpoint"
    assert by_path.verified_files == ["rank-00000.safetensors"]
    assert_equal(by_path.tensors, {f"model.{n}": t for n, t in state.items()})
    newest = weights.load(tmp_path / "store", run="sft")
    assert_equal(newest.tensors, {f"model.{n}": t for n, t in model_state(2).items()})
    chosen = weights.load(tmp_path / "store", run="sft", step=7, include=["model.model.norm.*"])
    assert_equal(chosen.tensors, {"model.model.norm.weight": state["model.norm.weight"]})
    # A verified file is read whole (its checksum covers every byte), even for one tensor.
    assert chosen.bytes_read > chosen.nbytes


def test_a_damaged_checkpoint_is_refused_and_nothing_returned(tmp_path: Path) -> None:
    ckpt = mouthguard.Checkpointer(tmp_path / "store", run="r", background=False)
    ckpt.save(1, model_state())
    rank_file = tmp_path / "store" / "fast" / "r" / f"{1:012d}" / "rank-00000.safetensors"
    flip_byte(rank_file, -3)
    with pytest.raises(ChecksumMismatchError) as excinfo:
        weights.load(tmp_path / "store", run="r")
    # The message names the file and the checkpoint it belongs to.
    assert "rank-00000.safetensors of run 'r' step 1" in str(excinfo.value)
    # Unverified, the same bytes load (the flip is in tensor data): the caller chose so.
    loaded = weights.load(tmp_path / "store", run="r", verify=False)
    assert loaded.unverified_files == ["rank-00000.safetensors"]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("slot_bytes", [512, 1 << 24])
def test_tensor_parallel_loads_this_rank_s_slice(
    tmp_path: Path, rank: int, slot_bytes: int
) -> None:
    state = model_state()
    directory = write_sharded(tmp_path / "m", state)
    tp = weights.TensorParallel(rank, 2, TP_RULES)
    loaded = weights.load(directory, tensor_parallel=tp, slot_bytes=slot_bytes)
    expected = {}
    for name, tensor in state.items():
        dim = next((d for p, d in TP_RULES if name.endswith(p.removeprefix("*"))), None)
        expected[name] = tensor if dim is None else tensor.chunk(2, dim)[rank].contiguous()
    assert_equal(loaded.tensors, expected)
    assert loaded.nbytes == sum(t.numel() * t.element_size() for t in expected.values())


def test_tensor_parallel_on_a_checkpoint_reads_less_unverified(tmp_path: Path) -> None:
    big = {f"l{i}.q_proj.weight": torch.randn(512, 1024) for i in range(4)}  # 2 MiB each
    mouthguard.Checkpointer(tmp_path / "s", run="r", background=False).save(1, big)
    tp = weights.TensorParallel(1, 4, TP_RULES)
    verified = weights.load(tmp_path / "s", run="r", tensor_parallel=tp)
    quick = weights.load(tmp_path / "s", run="r", tensor_parallel=tp, verify=False)
    for loaded in (verified, quick):
        for name, tensor in big.items():
            assert torch.equal(loaded.tensors[name], tensor.chunk(4, 0)[1])
    # Verified: every tensor byte read for the checksum. Not: only this rank's quarter.
    assert verified.bytes_read == sum(t.numel() * 4 for t in big.values())
    assert quick.bytes_read == quick.nbytes == sum(t.numel() for t in big.values())


def test_an_uneven_split_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    directory = write_single(tmp_path / "m", {"a.q_proj.weight": torch.ones(5, 4)})
    with pytest.raises(WeightsError, match=r"a\.q_proj\.weight: dimension 0"):
        weights.load(directory, tensor_parallel=weights.TensorParallel(0, 2, TP_RULES))


def test_the_ring_bounds_host_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Row-parallel slices cannot land in their tensor directly: they bounce through
    # the ring, whose memory is fixed by its slots whatever the model's size.
    rings: list[host_ring.HostRing] = []
    real = host_ring.HostRing

    def counting(*args: object, **kwargs: object) -> host_ring.HostRing:
        ring = real(*args, **kwargs)  # type: ignore[arg-type]
        rings.append(ring)
        return ring

    monkeypatch.setattr("mouthguard.weights.loader.HostRing", counting)
    state = {f"l{i}.o_proj.weight": torch.randn(64, 256) for i in range(8)}  # 512 KiB
    directory = write_sharded(tmp_path / "m", state, shards=2)
    tp = weights.TensorParallel(0, 2, TP_RULES)
    loaded = weights.load(directory, tensor_parallel=tp, slot_bytes=8192, parallel_files=2)
    for name, tensor in state.items():
        assert torch.equal(loaded.tensors[name], tensor.chunk(2, 1)[0])
    assert len(rings) == 2  # one per file
    assert all(r.nbytes == (READS_AHEAD + 1) * 8192 for r in rings)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"w": "../outside.safetensors"}, "not a file name"),
        ({"w": "sub/dir.safetensors"}, "not a .safetensors file beside it"),
        ({"w": "model.safetensors", "ghost": "model.safetensors"}, "lacks them"),
        ({"w": 3}, "not a file name"),
        ({}, "no weight_map"),
    ],
)
def test_a_hostile_index_is_refused(
    tmp_path: Path, mapping: dict[str, object], message: str
) -> None:
    directory = write_single(tmp_path / "m", {"w": torch.ones(3)})
    index = {"weight_map": mapping}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=message):
        weights.load(directory)


def test_an_index_that_is_not_json_is_refused(tmp_path: Path) -> None:
    directory = write_single(tmp_path / "m", {"w": torch.ones(3)})
    (directory / "model.safetensors.index.json").write_text('{"weight_map": {"w": NaN}}')
    with pytest.raises(WeightsError, match="not valid JSON"):
        weights.load(directory)


def test_a_truncated_shard_is_refused(tmp_path: Path) -> None:
    directory = write_single(tmp_path / "m", {"w": torch.ones(1000)})
    file = directory / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    with pytest.raises(RankFileError, match="covers") as excinfo:
        weights.load(directory)
    assert str(file) in str(excinfo.value)  # the header error names the file it is about


def test_nothing_loadable_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match=r"no model\.safetensors\.index\.json"):
        weights.load(tmp_path / "empty")
    with pytest.raises(WeightsError, match="not a directory"):
        weights.load(tmp_path / "missing")
    with pytest.raises(WeightsError, match="no file"):
        weights.load(write_single(tmp_path / "m", {"w": torch.ones(1)}), files=["other"])


def test_a_multi_rank_checkpoint_needs_one_rank_s_file(tmp_path: Path) -> None:
    from tests.weights.multirank import save_two_ranks  # noqa: PLC0415 - spawns processes

    store = save_two_ranks(tmp_path / "store")
    with pytest.raises(WeightsError, match="choose one rank's file"):
        weights.load(store, run="tp")
    rank1 = weights.load(store, run="tp", files=["rank-00001.safetensors"])
    assert torch.equal(rank1.tensors["w"], torch.full((4,), 1.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="no CUDA device"):
        weights.load(write_single(tmp_path / "m", {"w": torch.ones(1)}), device="cuda")


def test_gds_falls_back_with_a_reason() -> None:
    usable, reason = gds_status()
    try:
        import kvikio  # type: ignore[import-not-found]  # noqa: F401, PLC0415
    except ImportError:
        assert (usable, reason) == (False, "kvikio is not installed")
    else:  # pragma: no cover - only where kvikio is installed
        assert reason


def test_bad_tensor_parallel_arguments_are_refused() -> None:
    with pytest.raises(WeightsError, match="rank 2 of 2"):
        weights.TensorParallel(2, 2)
    with pytest.raises(WeightsError, match="PATTERN=DIM"):
        weights.parse_rules(["*.weight"])
    assert weights.parse_rules(["a=b=1", "*.w=-1"]) == (("a=b", 1), ("*.w", -1))
