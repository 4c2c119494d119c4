"""Checkpointer: round trips, verification, fallback, invisibility of uncommitted data."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import mouthguard
from mouthguard.checkpoint import loading
from mouthguard.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NoValidCheckpointError,
    StateMismatchError,
    UnsupportedStateError,
)
from tests.checkpoint.helpers import assert_same, flip_byte, step_path

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(
        max(info.min, -1000), min(info.max, 1000), shape, generator=gen, dtype=dtype
    )


def _rich_state() -> dict[str, object]:
    tied = torch.randn(8, 4)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "dtypes": {str(d): _tensor(d, (3, 5), i) for i, d in enumerate(ALL_DTYPES)},
        "scalar": torch.tensor(2.5),
        "scalar_int": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "empty3": torch.zeros(2, 0, 3, dtype=torch.bfloat16),
        "transposed": base.t(),
        "strided": base[:, ::2],
        "embed": tied,
        "lm_head": tied,
        "meta": {
            "lr": 3e-4,
            "nan": float("nan"),
            "inf": float("-inf"),
            "tag": "x",
            "none": None,
            "flags": (True, False),
            "blob": b"\x00\x01",
            "ids": {0: "a", 1: "b"},
        },
        "step": 12,
    }


def test_roundtrip_every_dtype_and_shape(ckpt: mouthguard.Checkpointer) -> None:
    state = _rich_state()
    info = ckpt.save(1, state)
    loaded = ckpt.load()
    assert loaded.step == 1 and info.step == 1
    assert_same(state, loaded.state)


def test_tied_tensors_saved_once_and_restored_tied(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tie
    state = {"model": model.state_dict()}
    ckpt.save(1, state)
    names = list(load_file(step_path(store, "r", 1) / "rank-00000.safetensors"))
    assert names == ["model.0.weight"]
    loaded = ckpt.load().state
    assert isinstance(loaded, dict)
    restored = loaded["model"]
    assert restored["0.weight"] is restored["1.weight"]


def test_rank_files_open_with_real_safetensors(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    state = {"dtypes": {str(d): _tensor(d, (4, 3), i) for i, d in enumerate(ALL_DTYPES)}}
    ckpt.save(5, state)
    path = step_path(store, "r", 5) / "rank-00000.safetensors"
    tensors = load_file(path)
    for d in ALL_DTYPES:
        assert torch.equal(tensors[f"dtypes.{d}"], state["dtypes"][str(d)])
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_len) % 4096 == 0


def test_files_per_checkpoint_is_world_size_plus_one(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(3, {f"t{i}": torch.randn(10) for i in range(50)})
    assert sorted(p.name for p in step_path(store, "r", 3).iterdir()) == [
        "manifest.json",
        "rank-00000.safetensors",
    ]


def test_importance_recorded_and_golden_alias(ckpt: mouthguard.Checkpointer) -> None:
    assert ckpt.save(1, {}, importance="golden").importance is mouthguard.Importance.CRITICAL
    assert ckpt.save(2, {}, importance="milestone").importance is mouthguard.Importance.MILESTONE
    assert [i.importance.value for i in ckpt.list()] == ["critical", "milestone"]
    with pytest.raises(ValueError, match="unknown importance"):
        ckpt.save(3, {}, importance="precious")


def test_unsupported_object_names_key_path(ckpt: mouthguard.Checkpointer) -> None:
    class Foo:
        pass

    with pytest.raises(UnsupportedStateError, match=r"state\['optim'\]\['foo'\]"):
        ckpt.save(1, {"optim": {"lr": 1.0, "foo": Foo()}})
    assert ckpt.list() == []


def test_existing_valid_step_is_refused(ckpt: mouthguard.Checkpointer) -> None:
    ckpt.save(1, {"a": torch.ones(2)})
    with pytest.raises(CheckpointExistsError):
        ckpt.save(1, {"a": torch.zeros(2)})
    assert torch.equal(ckpt.load(1).state["a"], torch.ones(2))  # type: ignore[index]


def test_directory_without_manifest_is_invisible(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"a": torch.ones(2)})
    ckpt.save(2, {"a": torch.full((2,), 2.0)})
    (step_path(store, "r", 2) / "manifest.json").unlink()
    assert [i.step for i in ckpt.list()] == [1]
    assert ckpt.load().step == 1


@pytest.mark.parametrize("where", ["header", "first_data", "middle", "last"])
def test_flipped_rank_file_byte_falls_back(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store, where: str
) -> None:
    ckpt.save(1, {"w": torch.arange(20000, dtype=torch.float32)})
    ckpt.save(2, {"w": torch.arange(20000, dtype=torch.float32) * 2})
    path = step_path(store, "r", 2) / "rank-00000.safetensors"
    offset = {"header": 100, "first_data": 4096, "middle": path.stat().st_size // 2, "last": -1}[
        where
    ]
    flip_byte(path, offset)
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="step 2") as record:
        loaded = ckpt.load()
    assert loaded.step == 1
    assert torch.equal(loaded.state["w"], torch.arange(20000, dtype=torch.float32))  # type: ignore[index]
    assert loaded.rejected[0].step == 2
    assert "rank-00000.safetensors" in str(record[0].message)
    with (
        pytest.warns(mouthguard.CheckpointFallbackWarning, match="another copy$"),
        pytest.raises(CorruptCheckpointError),
    ):
        ckpt.load(2)


def test_flipped_manifest_byte_falls_back(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(3)})
    ckpt.save(2, {"w": torch.zeros(3), "meta": {"x": 1}})
    manifest = step_path(store, "r", 2) / "manifest.json"
    size = manifest.stat().st_size
    for offset in (0, size // 3, size // 2, size - 5):
        original = manifest.read_bytes()
        flip_byte(manifest, offset, 0x01)
        with pytest.warns(mouthguard.CheckpointFallbackWarning, match="manifest"):
            assert ckpt.load().step == 1
        manifest.write_bytes(original)
    assert ckpt.load().step == 2


def test_missing_and_truncated_files_fall_back(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(1000)})
    ckpt.save(2, {"w": torch.ones(1000)})
    ckpt.save(3, {"w": torch.ones(1000)})
    (step_path(store, "r", 3) / "rank-00000.safetensors").unlink()
    rank2 = step_path(store, "r", 2) / "rank-00000.safetensors"
    rank2.write_bytes(rank2.read_bytes()[:-10])
    with pytest.warns(mouthguard.CheckpointFallbackWarning):
        loaded = ckpt.load()
    assert loaded.step == 1
    assert [r.step for r in loaded.rejected] == [3, 2]
    assert "size" in loaded.rejected[1].reason


def test_sparse_file_of_right_size_is_rejected(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    """A file of the right length full of zeros (a lost OST stripe) fails its checksum."""
    ckpt.save(1, {"w": torch.ones(100)})
    ckpt.save(2, {"w": torch.ones(5000)})
    path = step_path(store, "r", 2) / "rank-00000.safetensors"
    data = bytearray(path.read_bytes())
    data[4096:] = bytes(len(data) - 4096)
    path.write_bytes(bytes(data))
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="checksum mismatch"):
        assert ckpt.load().step == 1


def test_no_valid_checkpoint_raises(ckpt: mouthguard.Checkpointer, store: mouthguard.Store) -> None:
    with pytest.raises(CheckpointNotFoundError):
        ckpt.load()
    ckpt.save(1, {"w": torch.ones(10)})
    flip_byte(step_path(store, "r", 1) / "rank-00000.safetensors", -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NoValidCheckpointError, match="checksum"):
            ckpt.load()


def test_load_into_fills_tensors_in_place(ckpt: mouthguard.Checkpointer) -> None:
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    ckpt.save(1, {"model": model.state_dict(), "optim": opt.state_dict()})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    target = {"model": model.state_dict(), "optim": opt.state_dict()}
    pointers = {k: v.data_ptr() for k, v in target["model"].items()}
    loaded = ckpt.load(into=target).state
    assert isinstance(loaded, dict)
    for key, value in loaded["model"].items():
        assert value.data_ptr() == pointers[key]
        assert torch.equal(value, saved[key])
    assert torch.equal(model.weight, saved["weight"])


def test_load_into_mismatch_is_clear(ckpt: mouthguard.Checkpointer) -> None:
    ckpt.save(1, {"w": torch.ones(4)})
    with pytest.raises(StateMismatchError, match=r"state\['w'\]"):
        ckpt.load(into={"w": torch.ones(5)})


def test_resave_over_damaged_step_sets_it_aside(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(10)})
    ckpt.save(2, {"w": torch.ones(10)})
    flip_byte(step_path(store, "r", 2) / "rank-00000.safetensors", -1)
    ckpt.save(2, {"w": torch.full((10,), 5.0)})
    assert torch.equal(ckpt.load().state["w"], torch.full((10,), 5.0))  # type: ignore[index]
    run_dir = step_path(store, "r", 2).parent
    assert any(".rejected-" in p.name for p in run_dir.iterdir())


def test_reference_values_round_trip(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    ckpt.save(1, {"w": torch.ones(1)}, reference={"loss": 1.25, "grad_norm": float("inf")})
    body = json.loads((step_path(store, "r", 1) / "manifest.json").read_text())
    assert body["reference"]["loss"] == 1.25


def test_list_is_sorted_and_counts_bytes(ckpt: mouthguard.Checkpointer) -> None:
    for step in (30, 10, 20):
        ckpt.save(step, {"w": torch.zeros(1024)})
    infos = ckpt.list()
    assert [i.step for i in infos] == [10, 20, 30]
    assert all(i.tensor_bytes == 4096 and i.nbytes == 8192 for i in infos)


def test_memory_store_works(tmp_path: Path) -> None:
    config = tmp_path / "mouthguard.toml"
    config.write_text('[[tiers]]\nname = "ram"\nkind = "memory"\n')
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(config), run="m")
    ckpt.save(1, {"w": torch.arange(5)})
    assert torch.equal(ckpt.load().state["w"], torch.arange(5))  # type: ignore[index]


def test_a_checkpointer_is_a_context_manager_that_closes(tmp_path: Path) -> None:
    with mouthguard.Checkpointer(tmp_path / "store", run="r", background=False) as ckpt:
        handle = ckpt.save_async(1, {"w": torch.ones(8)})
    # Leaving the block finished the save in flight and freed the staging buffer.
    assert handle.done() and handle.result().step == 1
    assert ckpt._saves.saver.staging.capacity == 0


def test_a_fallback_is_reported_once(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning is the report: no WARNING log line, which Python's last-resort handler
    would print to stderr a second time where the application configured no logging."""
    ckpt.save(1, {"w": torch.ones(64)})
    ckpt.save(2, {"w": torch.ones(64) * 2})
    flip_byte(step_path(store, "r", 2) / "rank-00000.safetensors", -1)
    with caplog.at_level("WARNING"), pytest.warns(mouthguard.CheckpointFallbackWarning) as record:
        assert ckpt.load().step == 1
    assert len(record) == 1
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_load_creates_tensors_on_the_device_asked_for(ckpt: mouthguard.Checkpointer) -> None:
    ckpt.save(1, {"w": torch.arange(10.0)})
    loaded = ckpt.load(1, device="cpu").state
    assert isinstance(loaded, dict)
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], torch.arange(10.0))
    with pytest.raises(ValueError, match="'no-such-device' is not a device"):
        ckpt.load(1, device="no-such-device")


# --- load(at_or_before=...): the resume a trainer asks for ------------------------


def test_at_or_before_loads_that_step_and_never_a_newer_one(
    ckpt: mouthguard.Checkpointer,
) -> None:
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((4,), float(step))})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the step asked for loads: nothing to warn of
        assert ckpt.load(at_or_before=2).step == 2
    with pytest.raises(ValueError, match="not both"):
        ckpt.load(2, at_or_before=2)
    with pytest.raises(CheckpointNotFoundError, match="at or before step 0"):
        ckpt.load(at_or_before=0)


def test_at_or_before_falls_back_past_a_damaged_step_and_says_so(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store
) -> None:
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((4,), float(step))})
    flip_byte(step_path(store, "r", 2) / "rank-00000.safetensors", -1)
    with pytest.warns(mouthguard.CheckpointFallbackWarning) as warned:
        loaded = ckpt.load(at_or_before=2)
    assert loaded.step == 1
    assert any("falling back to step 1" in str(w.message) for w in warned)
    flip_byte(step_path(store, "r", 1) / "rank-00000.safetensors", -1)
    with (
        pytest.warns(mouthguard.CheckpointFallbackWarning),
        pytest.raises(NoValidCheckpointError, match="at or before step 2"),
    ):
        ckpt.load(at_or_before=2)


def test_a_candidate_deleted_after_the_listing_is_passed_over(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention (or another trainer's top-k) removes a step while the load walks back."""
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((4,), float(step))})
    listed = ckpt.steps()
    shutil.rmtree(step_path(store, "r", 3))
    shutil.rmtree(step_path(store, "r", 2))
    monkeypatch.setattr(ckpt, "steps", lambda: listed)
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="step 3 cannot be loaded"):
        loaded = ckpt.load(at_or_before=3)
    assert loaded.step == 1


def test_a_candidate_deleted_while_it_is_read_is_not_reported_as_damage(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((4,), float(step))})
    real = loading.load_copy

    def vanishing(tier: Any, prefix: str, manifest: Any, **kw: Any) -> object:
        if manifest.step == 2:
            shutil.rmtree(step_path(store, "r", 2))  # gone between the manifest and the data
        return real(tier, prefix, manifest, **kw)

    monkeypatch.setattr(loading, "load_copy", vanishing)
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="falling back to step 1"):
        loaded = ckpt.load(at_or_before=2)
    assert loaded.step == 1
    assert loaded.rejected == []  # not damage: nothing to repair
    # No damage report written into the deleted step's place (it would recreate it).
    assert not step_path(store, "r", 2).exists()


FLOAT8_DTYPES = [
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]


@pytest.mark.parametrize("name", FLOAT8_DTYPES)
def test_every_float8_dtype_safetensors_carries_round_trips(
    ckpt: mouthguard.Checkpointer, store: mouthguard.Store, name: str
) -> None:
    """Every byte pattern (NaN encodings included) comes back, and safetensors reads it."""
    dtype = getattr(torch, name)
    raw = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16)
    ckpt.save(1, {"w": raw.view(dtype), "other": torch.ones(2)})
    loaded = ckpt.load(1).state
    assert isinstance(loaded, dict) and loaded["w"].dtype == dtype
    assert torch.equal(loaded["w"].view(torch.uint8), raw)
    theirs = load_file(step_path(store, "r", 1) / "rank-00000.safetensors")
    (key,) = [k for k in theirs if theirs[k].dtype == dtype]
    assert torch.equal(theirs[key].view(torch.uint8), raw)
