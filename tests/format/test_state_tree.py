"""Tests of splitting a state into stored tensors and a skeleton, and rebuilding it.

Storage is simulated the way the loader behaves: every StoredTensor becomes one
independent contiguous copy (a fresh allocation, as if read from a rank file), and
the lookup returns the same object for every reference to a name. The skeleton
goes through strict JSON text, as it does inside a manifest.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from mouthguard.errors import FormatError, UnsupportedStateError
from mouthguard.format import typed_json
from mouthguard.format.dtypes import dtype_code
from mouthguard.format.rank_file import build_layout
from mouthguard.format.state_tree import (
    STORAGE_PREFIX,
    FlatState,
    flatten_state,
    iter_tensors,
    tensor_references,
    unflatten_state,
)

# --- helpers -------------------------------------------------------------------


class Storage:
    """Stored tensors as a loader would hold them: one fresh contiguous copy per name."""

    def __init__(self, flat: FlatState) -> None:
        names = [s.name for s in flat.tensors]
        assert len(set(names)) == len(names), f"stored names are not unique: {names}"
        self.tensors = {
            s.name: s.tensor.detach().clone(memory_format=torch.contiguous_format)
            for s in flat.tensors
        }
        self.calls: list[tuple[str, str]] = []

    def lookup(self, name: str, path: str) -> torch.Tensor:
        self.calls.append((name, path))
        return self.tensors[name]


def round_trip(state: object) -> tuple[FlatState, Storage, Any]:
    flat = flatten_state(state)
    # The writer must be able to lay the stored tensors out in a rank file.
    build_layout(
        [(s.name, dtype_code(s.tensor.dtype), tuple(s.tensor.shape)) for s in flat.tensors], {}
    )
    skeleton = typed_json.loads_strict(typed_json.dumps_strict(flat.skeleton))
    storage = Storage(flat)
    return flat, storage, unflatten_state(skeleton, storage.lookup)


def names(flat: FlatState) -> list[str]:
    return [s.name for s in flat.tensors]


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def assert_equal(expected: torch.Tensor, actual: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.norm = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.embed.weight


# --- plain round trips -------------------------------------------------------------


def test_nested_state_round_trips_with_dotted_names() -> None:
    fc_w, fc_b = torch.randn(3, 4), torch.randn(3)
    layers = [torch.arange(5), torch.ones(2, 2, dtype=torch.bfloat16)]
    state = {
        "model": {"fc": {"weight": fc_w, "bias": fc_b}, "layers": layers},
        "step": 7,
        "pair": (torch.tensor(1.5), "x"),
    }
    flat, storage, out = round_trip(state)
    assert names(flat) == [
        "model.fc.weight",
        "model.fc.bias",
        "model.layers.0",
        "model.layers.1",
        "pair.0",
    ]
    assert flat.skeleton["model"]["fc"]["weight"] == {"$tensor": "model.fc.weight"}  # type: ignore[index, call-overload]
    assert_equal(fc_w, out["model"]["fc"]["weight"])
    assert_equal(fc_b, out["model"]["fc"]["bias"])
    assert_equal(layers[0], out["model"]["layers"][0])
    assert_equal(layers[1], out["model"]["layers"][1])
    assert isinstance(out["pair"], tuple)
    assert_equal(torch.tensor(1.5), out["pair"][0])
    assert out["pair"][1] == "x"
    assert out["step"] == 7
    # Restored tensors are the stored copies, not the originals.
    assert out["model"]["fc"]["weight"] is storage.tensors["model.fc.weight"]
    assert not shares_memory(out["model"]["fc"]["weight"], fc_w)
    assert flat.tensor_bytes == (12 + 3) * 4 + 5 * 8 + 4 * 2 + 4


def test_lookup_sees_key_paths() -> None:
    t = torch.zeros(1)
    _, storage, _ = round_trip({"a": {"b": [t]}})
    assert storage.calls == [("a.b.0", "state['a']['b'][0]")]


def test_root_tensor_is_named_tensor() -> None:
    t = torch.arange(3.0)
    flat, _, out = round_trip(t)
    assert names(flat) == ["tensor"]
    assert_equal(t, out)


def test_state_without_tensors() -> None:
    flat, storage, out = round_trip({"a": [1, 2.5, None], "b": (True, b"x")})
    assert flat.tensors == ()
    assert out == {"a": [1, 2.5, None], "b": (True, b"x")}
    assert storage.calls == []


def test_zero_d_and_empty_tensors_round_trip() -> None:
    state = {
        "scalar": torch.tensor(2, dtype=torch.int64),
        "empty": torch.empty(0),
        "empty2": torch.empty(3, 0, dtype=torch.int8),
        "empty3": torch.empty(0),
    }
    flat, _, out = round_trip(state)
    assert len(flat.tensors) == 4
    for key, tensor in state.items():
        assert_equal(tensor, out[key])


def test_parameters_and_grad_tensors_round_trip_as_values() -> None:
    p = nn.Parameter(torch.randn(2, 3))
    (p * 2).sum().backward()
    flat, _, out = round_trip({"p": p, "g": p.grad})
    assert names(flat) == ["p", "g"]
    assert_equal(p.detach(), out["p"])
    assert_equal(p.grad, out["g"])  # type: ignore[arg-type]


# --- tied weights ----------------------------------------------------------------


def test_same_tensor_under_two_keys_is_stored_once() -> None:
    t = torch.randn(4, 5)
    flat, storage, out = round_trip({"encoder": {"w": t}, "decoder": {"w": t}, "other": t + 1})
    assert names(flat) == ["encoder.w", "other"]
    assert flat.skeleton["decoder"]["w"] == {"$tensor": "encoder.w"}  # type: ignore[index, call-overload]
    assert out["encoder"]["w"] is out["decoder"]["w"]
    assert out["encoder"]["w"] is storage.tensors["encoder.w"]
    assert_equal(t, out["decoder"]["w"])
    assert_equal(t + 1, out["other"])


def test_tied_embedding_and_lm_head_state_dict_stored_once() -> None:
    model = TiedLM()
    sd = model.state_dict()
    # state_dict() detaches each entry: two distinct objects viewing one storage.
    assert sd["embed.weight"] is not sd["lm_head.weight"]
    assert shares_memory(sd["embed.weight"], sd["lm_head.weight"])
    flat, _, out = round_trip({"model": sd})
    assert names(flat) == ["model.embed.weight", "model.norm.weight", "model.norm.bias"]
    assert out["model"]["embed.weight"] is out["model"]["lm_head.weight"]
    assert list(out["model"]) == list(sd)
    for key, tensor in sd.items():
        assert_equal(tensor, out["model"][key])
    # The restored state loads into a fresh model.
    fresh = TiedLM()
    fresh.load_state_dict(out["model"])
    assert torch.equal(fresh.lm_head.weight, model.embed.weight)


def test_tied_weights_with_keep_vars_parameters() -> None:
    model = TiedLM()
    sd = model.state_dict(keep_vars=True)
    flat, _, out = round_trip(sd)
    assert "lm_head.weight" not in names(flat)
    assert out["embed.weight"] is out["lm_head.weight"]


def test_same_storage_identical_views_in_different_containers() -> None:
    base = torch.arange(10.0)
    a, b = base[2:6], base[2:6]
    assert a is not b
    flat, _, out = round_trip([a, {"x": b}])
    assert names(flat) == ["0"]
    assert out[0] is out[1]["x"]
    assert_equal(base[2:6], out[0])


# --- differing views of one storage -----------------------------------------------


def test_differing_views_share_one_storage_blob() -> None:
    base = torch.arange(12.0)
    a = base[:6]
    b = base[3:].view(3, 3)
    flat, storage, out = round_trip({"a": a, "b": b})
    assert names(flat) == [STORAGE_PREFIX + "a"]
    blob = flat.tensors[0].tensor
    assert blob.dtype == torch.uint8
    assert blob.dim() == 1
    assert blob.numel() == 12 * 4  # the covered bytes, stored once
    assert flat.skeleton["a"] == {  # type: ignore[index, call-overload]
        "$view": {
            "storage": "__storage__.a",
            "dtype": "F32",
            "offset": 0,
            "shape": [6],
            "stride": [1],
        }
    }
    assert flat.skeleton["b"] == {  # type: ignore[index, call-overload]
        "$view": {
            "storage": "__storage__.a",
            "dtype": "F32",
            "offset": 3,
            "shape": [3, 3],
            "stride": [3, 1],
        }
    }
    ra, rb = out["a"], out["b"]
    assert_equal(a, ra)
    assert_equal(b, rb)
    assert ra.stride() == (1,)
    assert rb.stride() == (3, 1)
    assert shares_memory(ra, rb)
    assert shares_memory(ra, storage.tensors["__storage__.a"])
    assert not shares_memory(ra, base)
    # Writes through one view are seen by the other, as before saving.
    ra[4] = -100.0
    assert rb[0, 1].item() == -100.0
    rb[0, 0] = -7.0
    assert ra[3].item() == -7.0
    assert base[3].item() == 3.0


def test_blob_covers_only_the_bytes_in_use() -> None:
    base = torch.arange(100.0)
    a = base[20:25]
    b = base[23:29].view(2, 3)
    flat, _, out = round_trip({"a": a, "b": b})
    blob = flat.tensors[0].tensor
    assert blob.numel() == (29 - 20) * 4
    assert torch.equal(blob, base[20:29].view(torch.uint8).reshape(-1))
    assert flat.skeleton["b"]["$view"]["offset"] == 3  # type: ignore[index, call-overload]
    assert_equal(a, out["a"])
    assert_equal(b, out["b"])
    out["a"][3] = 0.5
    assert out["b"][0, 0].item() == 0.5


def test_base_with_non_contiguous_views_rebuilds_strides() -> None:
    base = torch.arange(12.0)
    grid = base.view(3, 4)
    state = {"base": base, "t": grid.t(), "step": base[1::3], "col": grid[:, 2]}
    flat, _, out = round_trip(state)
    assert len(flat.tensors) == 1
    assert flat.tensors[0].name.startswith(STORAGE_PREFIX)
    for key, tensor in state.items():
        assert_equal(tensor, out[key])
        assert out[key].stride() == tensor.stride()
        assert shares_memory(out[key], out["base"])
    out["base"][6] = 60.0
    assert out["t"][2, 1].item() == 60.0
    assert out["col"][1].item() == 60.0


def test_views_with_different_dtypes_share_storage() -> None:
    floats = torch.tensor([1.0, -2.0, 0.5, 3.0])
    ints = floats.view(torch.int32)
    raw = floats.view(torch.uint8)[4:12]
    state = {"f": floats, "i": ints, "raw": raw}
    _, _, out = round_trip(state)
    for key, tensor in state.items():
        assert_equal(tensor, out[key])
    out["f"][1] = 8.0
    assert out["i"][1].item() == floats.new_tensor(8.0).view(torch.int32).item()
    assert torch.equal(out["raw"][0:4], torch.tensor([8.0]).view(torch.uint8))


def test_views_of_tied_and_sliced_parameter() -> None:
    qkv = torch.randn(9, 4)
    state = {"q": qkv[0:3], "k": qkv[3:6], "v": qkv[6:9], "qkv": qkv, "q_again": qkv[0:3]}
    flat, _, out = round_trip(state)
    assert len(flat.tensors) == 1
    for key, tensor in state.items():
        assert_equal(tensor, out[key])
    out["qkv"][4, 0] = 123.0
    assert out["k"][1, 0].item() == 123.0


# --- non-contiguous single views --------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).view(3, 4).t(),
        lambda: torch.arange(20)[::3],
        lambda: torch.arange(24.0).view(2, 3, 4).permute(2, 0, 1),
        lambda: torch.arange(24.0).view(4, 6)[1:3, ::2],
        lambda: torch.tensor([1.0, 2.0]).expand(3, 2),
        lambda: torch.arange(6, dtype=torch.int16).view(2, 3)[:, 1],
    ],
    ids=["transpose", "step-slice", "permute", "slice-2d", "expand", "column"],
)
def test_non_contiguous_view_round_trips_by_value(make: Any) -> None:
    tensor = make()
    assert not tensor.is_contiguous()
    flat, _, out = round_trip({"x": tensor})
    assert names(flat) == ["x"]
    assert_equal(tensor, out["x"])
    assert out["x"].is_contiguous()


# --- names ----------------------------------------------------------------------


def test_colliding_dotted_names_are_made_unique() -> None:
    t1, t2 = torch.tensor([1.0]), torch.tensor([2.0])
    flat, _, out = round_trip({"a.b": t1, "a": {"b": t2}})
    assert names(flat) == ["a.b", "a.b#2"]
    assert_equal(t1, out["a.b"])
    assert_equal(t2, out["a"]["b"])


def test_collisions_with_suffix_lookalikes_stay_unique() -> None:
    tensors = [torch.tensor([float(i)]) for i in range(5)]
    state = {
        "a.b": tensors[0],
        "a": {"b": tensors[1], "b#2": tensors[2]},
        "a.b#2": tensors[3],
        "a.b#2#2": tensors[4],
    }
    flat, _, out = round_trip(state)
    assert len(set(names(flat))) == 5
    assert_equal(tensors[0], out["a.b"])
    assert_equal(tensors[1], out["a"]["b"])
    assert_equal(tensors[2], out["a"]["b#2"])
    assert_equal(tensors[3], out["a.b#2"])
    assert_equal(tensors[4], out["a.b#2#2"])


def test_int_and_str_keys_colliding() -> None:
    t1, t2 = torch.tensor([1]), torch.tensor([2])
    flat, _, out = round_trip({0: t1, "0": t2})
    assert names(flat) == ["0", "0#2"]
    assert_equal(t1, out[0])
    assert_equal(t2, out["0"])


def test_reserved_names_are_escaped() -> None:
    t1, t2, t3 = torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])
    flat, _, out = round_trip({"__metadata__": t1, "__storage__": {"x": t2}, "_": t3})
    assert all(not n.startswith(STORAGE_PREFIX) and n != "__metadata__" for n in names(flat))
    assert_equal(t1, out["__metadata__"])
    assert_equal(t2, out["__storage__"]["x"])
    assert_equal(t3, out["_"])


def test_shared_storage_blob_never_collides_with_a_plain_name() -> None:
    base = torch.arange(8.0)
    plain = torch.tensor([9.0])
    state = {"__storage__": {"a": plain}, "a": base[:4], "b": base[2:]}
    flat, _, out = round_trip(state)
    assert len(set(names(flat))) == 2
    assert_equal(plain, out["__storage__"]["a"])
    assert_equal(base[:4], out["a"])
    assert_equal(base[2:], out["b"])


# --- unsupported tensors ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.complex128, torch.float4_e2m1fn_x2])
def test_unsupported_dtype_names_key_path(dtype: torch.dtype) -> None:
    bad = torch.zeros(2, dtype=dtype)
    state = {"model": {"layers": [torch.zeros(1), {"z": bad}]}}
    with pytest.raises(
        UnsupportedStateError, match=r"state\['model'\]\['layers'\]\[1\]\['z'\]"
    ) as info:
        flatten_state(state)
    assert str(dtype) in str(info.value)


def test_non_tensor_objects_are_refused_with_key_path() -> None:
    with pytest.raises(UnsupportedStateError, match=r"state\['opt'\]\['fn'\]"):
        flatten_state({"opt": {"fn": lambda: None}})


# --- tensor_references -------------------------------------------------------------


def test_tensor_references_maps_names_to_key_paths() -> None:
    shared = torch.randn(2)
    base = torch.arange(6.0)
    state = {
        "enc": {"w": shared},
        "dec": [shared, torch.zeros(1)],
        "v1": base[:3],
        "v2": base[2:],
        "n": 1,
    }
    flat = flatten_state(state)
    refs = tensor_references(flat.skeleton)
    assert refs == {
        "enc.w": ["state['enc']['w']", "state['dec'][0]"],
        "dec.1": ["state['dec'][1]"],
        "__storage__.v1": ["state['v1']", "state['v2']"],
    }
    assert set(refs) == set(names(flat))


def test_tensor_references_of_plain_state_is_empty() -> None:
    assert tensor_references(typed_json.encode({"a": [1, 2], "b": "c"})) == {}


def test_iter_tensors_yields_key_paths_depth_first() -> None:
    t = torch.zeros(1)
    found = [(parts, id(x)) for parts, x in iter_tensors({"a": [t, {"b": t}], "c": (t,)})]
    assert found == [(("a", 0), id(t)), (("a", 1, "b"), id(t)), (("c", 0), id(t))]


# --- malformed skeletons ---------------------------------------------------------


def _blob_lookup(blob: torch.Tensor) -> Any:
    def lookup(name: str, path: str) -> torch.Tensor:
        if name != "s":
            raise AssertionError(f"unexpected lookup {name!r}")
        return blob

    return lookup


def _view(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "storage": "s",
        "dtype": "F32",
        "offset": 0,
        "shape": [2],
        "stride": [1],
    }
    spec.update(changes)
    return {"x": {"$view": spec}}


def test_valid_view_reference_builds() -> None:
    blob = torch.arange(16, dtype=torch.uint8)
    out: Any = unflatten_state(_view(offset=2, shape=[2], stride=[1]), _blob_lookup(blob))
    assert out["x"].dtype == torch.float32
    assert torch.equal(out["x"].view(torch.uint8), blob[8:16])
    # The whole blob is reachable, not a byte further.
    full: Any = unflatten_state(_view(offset=0, shape=[4]), _blob_lookup(blob))
    assert full["x"].numel() == 4


@pytest.mark.parametrize(
    "changes",
    [
        {"offset": 3},  # (3 + 2) * 4 = 20 > 16 bytes
        {"offset": 4, "shape": [1]},
        {"shape": [5]},
        {"shape": [2, 2], "stride": [4, 1]},
        {"shape": [2], "stride": [4]},
        {"offset": 10**30},
        {"stride": [10**30]},
        {"dtype": "F64", "shape": [3]},
    ],
    ids=["offset", "offset-1", "shape", "stride-2d", "stride", "huge-offset", "huge-stride", "f64"],
)
def test_view_reaching_outside_storage_is_rejected(changes: dict[str, object]) -> None:
    blob = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(FormatError, match=r"outside its shared storage|malformed shape"):
        unflatten_state(_view(**changes), _blob_lookup(blob))


@pytest.mark.parametrize(
    "changes",
    [
        {"offset": "0"},
        {"offset": -1},
        {"offset": True},
        {"offset": 0.0},
        {"offset": None},
        {"shape": "2"},
        {"shape": [2.0]},
        {"shape": [-2]},
        {"shape": [True]},
        {"stride": [-1]},
        {"stride": [1, 1]},
        {"stride": None},
        {"stride": [1.0]},
        {"storage": 5},
        {"storage": None},
        {"dtype": 4},
        {"dtype": None},
    ],
)
def test_malformed_view_reference_is_rejected(changes: dict[str, object]) -> None:
    blob = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(FormatError, match="malformed view reference"):
        unflatten_state(_view(**changes), _blob_lookup(blob))


@pytest.mark.parametrize("key", ["storage", "dtype", "offset", "shape", "stride"])
def test_view_reference_missing_a_field_is_rejected(key: str) -> None:
    skeleton = _view()
    del skeleton["x"]["$view"][key]  # type: ignore[index, attr-defined]
    with pytest.raises(FormatError, match="malformed view reference"):
        unflatten_state(skeleton, _blob_lookup(torch.zeros(16, dtype=torch.uint8)))


@pytest.mark.parametrize("code", ["F128", "", "c64"])
def test_view_with_unknown_dtype_is_rejected(code: str) -> None:
    with pytest.raises(FormatError, match="unknown tensor dtype"):
        unflatten_state(_view(dtype=code), _blob_lookup(torch.zeros(16, dtype=torch.uint8)))


@pytest.mark.parametrize(
    "blob",
    [torch.zeros(4), torch.zeros(4, 4, dtype=torch.uint8)],
    ids=["not-u8", "not-1d"],
)
def test_view_on_a_blob_of_the_wrong_kind_is_rejected(blob: torch.Tensor) -> None:
    with pytest.raises(FormatError, match="outside its shared storage"):
        unflatten_state(_view(), _blob_lookup(blob))


def test_view_on_misaligned_blob_is_rejected() -> None:
    blob = torch.zeros(17, dtype=torch.uint8)[1:]
    with pytest.raises(FormatError, match="misaligned"):
        unflatten_state(_view(), _blob_lookup(blob))


@pytest.mark.parametrize(
    ("shape", "stride"),
    [([2**63], [0]), ([2**64], [0]), ([2**40, 2**40], [0, 0])],
    ids=["2^63", "2^64", "product-overflow"],
)
def test_view_with_dims_beyond_int64_is_rejected(shape: list[int], stride: list[int]) -> None:
    blob = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(FormatError):
        unflatten_state(_view(shape=shape, stride=stride), _blob_lookup(blob))


@pytest.mark.parametrize(
    "tag",
    [
        {"$tensor": 3},
        {"$tensor": None},
        {"$tensor": ["a"]},
        {"$tensor": "a", "extra": 1},
        {"$view": "s"},
        {"$view": ["s"]},
        {"$view": {"storage": "s"}, "extra": 1},
        {"$other": "a"},
    ],
)
def test_malformed_tensor_reference_is_rejected(tag: dict[str, object]) -> None:
    def lookup(name: str, path: str) -> torch.Tensor:
        raise AssertionError("nothing may be looked up for a malformed reference")

    with pytest.raises(FormatError):
        unflatten_state({"x": tag}, lookup)


@pytest.mark.parametrize(
    "tag", [{"$tensor": 3}, {"$view": {"storage": 1}}, {"$view": "s"}, {"$other": "a"}]
)
def test_tensor_references_rejects_malformed_references(tag: dict[str, object]) -> None:
    with pytest.raises(FormatError, match="malformed tensor reference"):
        tensor_references({"a": [tag]})


def test_finish_hook_sees_every_leaf() -> None:
    base = torch.arange(6.0)
    shared = torch.ones(2)
    state = {"p": shared, "q": shared, "v1": base[:4], "v2": base[2:]}
    flat = flatten_state(state)
    storage = Storage(flat)
    seen: list[str] = []

    def finish(tensor: torch.Tensor, path: str) -> torch.Tensor:
        seen.append(path)
        return tensor * 10

    out: Any = unflatten_state(flat.skeleton, storage.lookup, finish)
    assert seen == ["state['p']", "state['q']", "state['v1']", "state['v2']"]
    assert_equal(shared * 10, out["p"])
    assert_equal(base[2:] * 10, out["v2"])
