"""Split a nested training state into stored tensors and a typed-JSON skeleton, and back.

The skeleton is the state with every tensor replaced by a reference:

* ``{"$tensor": NAME}`` — the tensor stored under NAME in the rank file. Tensors
  that are identical views of one storage (tied weights: the same Parameter
  reached through two keys) all refer to one NAME, so they are written once and
  restored as one tensor object — tied again.
* ``{"$view": {"storage": NAME, "dtype": CODE, "offset": N, "shape": [...],
  "stride": [...]}}`` — a tensor that shares storage with others through a
  *different* view (e.g. fused QKV slices). The covered bytes of the shared
  storage are stored once as a ``U8`` tensor NAME and every view is rebuilt on it.

Tensor NAMEs are the dotted key path (``model.fc.weight``) so that a plain
safetensors reader sees familiar names; collisions get a ``#n`` suffix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mouthguard.errors import FormatError, UnsupportedStateError
from mouthguard.format import typed_json
from mouthguard.format.dtypes import dtype_code, is_supported, itemsize, torch_dtype, validate_shape
from mouthguard.format.typed_json import JsonValue

# torch is imported by the functions that handle tensors: reading a skeleton's
# references (verify, ls) must not pay for importing it.
if TYPE_CHECKING:
    import torch

STORAGE_PREFIX = "__storage__."
_MAX_DEPTH = 256


@dataclass(frozen=True)
class StoredTensor:
    """A tensor to write: its name in the rank file and the tensor itself.

    ``tensor`` may be non-contiguous or on an accelerator; the writer makes a
    contiguous CPU copy at write time (one tensor at a time).
    """

    name: str
    tensor: torch.Tensor


@dataclass(frozen=True)
class FlatState:
    """A state split into its skeleton and the tensors to store, in file order."""

    skeleton: JsonValue
    tensors: tuple[StoredTensor, ...]

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data to be written."""
        return sum(t.tensor.numel() * t.tensor.element_size() for t in self.tensors)


def iter_tensors(state: object) -> Iterator[tuple[tuple[str | int, ...], torch.Tensor]]:
    """Yield ``(key_path_parts, tensor)`` for every tensor in ``state``, depth first.

    Walks dicts, lists and tuples exactly as the typed-JSON encoder does. Cycles and
    over-deep nesting are not descended into: the encoder reports them properly.
    """
    import torch  # noqa: PLC0415 - see the module's imports

    active: set[int] = set()

    def walk(
        obj: object, parts: tuple[str | int, ...]
    ) -> Iterator[tuple[tuple[str | int, ...], torch.Tensor]]:
        if isinstance(obj, torch.Tensor):
            yield parts, obj
            return
        if len(parts) > _MAX_DEPTH or id(obj) in active:
            return
        if isinstance(obj, dict):
            items: list[tuple[str | int, object]] = [
                (k if isinstance(k, str | int) else repr(k), v) for k, v in obj.items()
            ]
        elif isinstance(obj, list | tuple) and not isinstance(obj, torch.Size):
            items = list(enumerate(obj))
        else:
            return
        active.add(id(obj))
        for key, value in items:
            yield from walk(value, (*parts, key))
        active.discard(id(obj))

    return walk(state, ())


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None  # empty storages may all report a null pointer: never "shared"
    return (str(tensor.device), storage.data_ptr())


def _view_signature(tensor: torch.Tensor) -> tuple[object, ...]:
    return (tensor.dtype, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))


def _byte_extent(tensor: torch.Tensor) -> tuple[int, int]:
    size = tensor.element_size()
    start = int(tensor.storage_offset()) * size
    if tensor.numel() == 0:
        return start, start
    span = sum((int(d) - 1) * s for d, s in zip(tensor.shape, tensor.stride(), strict=True)) + 1
    return start, start + span * size


def flatten_state(state: object) -> FlatState:
    """Split ``state`` into a typed-JSON skeleton and the tensors to store.

    Raises:
        UnsupportedStateError: an object cannot be stored without pickle, or a tensor
            has a dtype safetensors cannot carry; the message names its key path.
    """
    import torch  # noqa: PLC0415 - see the module's imports

    found = list(iter_tensors(state))
    names = _unique_names(parts for parts, _ in found)
    groups: dict[object, list[tuple[str, tuple[str | int, ...], torch.Tensor]]] = {}
    for (parts, tensor), name in zip(found, names, strict=True):
        if not is_supported(tensor.dtype):
            path = typed_json.format_key_path(parts)
            raise UnsupportedStateError(
                f"cannot store {path}: tensor dtype {tensor.dtype} is not supported"
            )
        key = _storage_key(tensor) or ("unshared", id(tensor), len(groups))
        groups.setdefault(key, []).append((name, parts, tensor))

    refs: dict[int, JsonValue] = {}
    stored: list[StoredTensor] = []
    for members in groups.values():
        first_name, _, first = members[0]
        if all(_view_signature(t) == _view_signature(first) for _, _, t in members):
            stored.append(StoredTensor(first_name, first))
            for _, _, tensor in members:
                refs[id(tensor)] = {"$tensor": first_name}
            continue
        stored.append(_shared_storage_blob(first_name, members, refs))

    def hook(obj: object, _path: str) -> JsonValue | None:
        if isinstance(obj, torch.Tensor):
            return refs[id(obj)]
        return None

    skeleton = typed_json.encode(state, hook=hook)
    return FlatState(skeleton, tuple(stored))


def _shared_storage_blob(
    name: str,
    members: list[tuple[str, tuple[str | int, ...], torch.Tensor]],
    refs: dict[int, JsonValue],
) -> StoredTensor:
    """Store the bytes covered by differing views of one storage once, as a U8 tensor."""
    import torch  # noqa: PLC0415 - see the module's imports

    extents = [_byte_extent(t) for _, _, t in members]
    lo, hi = min(s for s, _ in extents), max(e for _, e in extents)
    blob_name = STORAGE_PREFIX + name
    for (_, parts, tensor), (start, _) in zip(members, extents, strict=True):
        if (start - lo) % tensor.element_size():
            path = typed_json.format_key_path(parts)
            raise UnsupportedStateError(f"cannot store {path}: view is not aligned to its dtype")
        refs[id(tensor)] = {
            "$view": {
                "storage": blob_name,
                "dtype": dtype_code(tensor.dtype),
                "offset": (start - lo) // tensor.element_size(),
                "shape": list(tensor.shape),
                "stride": list(tensor.stride()),
            }
        }
    first = members[0][2]
    raw = torch.empty(0, dtype=torch.uint8, device=first.device)
    raw.set_(first.untyped_storage(), lo, (hi - lo,), (1,))
    return StoredTensor(blob_name, raw)


def _unique_names(all_parts: Iterator[tuple[str | int, ...]]) -> list[str]:
    seen: dict[str, int] = {}
    names = []
    for parts in all_parts:
        base = ".".join(str(p) for p in parts) or "tensor"
        if base.startswith(STORAGE_PREFIX) or base == "__metadata__":
            base = "_" + base
        count = seen.get(base, 0)
        seen[base] = count + 1
        names.append(base if count == 0 else f"{base}#{count + 1}")
    # A "#n" suffix could itself collide with a real key; resolve until unique.
    taken: set[str] = set()
    for i, name in enumerate(names):
        candidate, n = name, 1
        while candidate in taken:
            n += 1
            candidate = f"{name}#{n}"
        taken.add(candidate)
        names[i] = candidate
    return names


TensorLookup = Callable[[str, str], "torch.Tensor"]
TensorFinish = Callable[["torch.Tensor", str], "torch.Tensor"]


def unflatten_state(
    skeleton: JsonValue, lookup: TensorLookup, finish: TensorFinish | None = None
) -> object:
    """Rebuild a state from its skeleton; ``lookup(name, key_path)`` returns stored tensors.

    A NAME referenced at several key paths resolves to whatever ``lookup`` returns
    for it (the loader returns one object per NAME, so tied tensors come back tied).
    ``finish(tensor, key_path)``, when given, sees every rebuilt tensor leaf (plain
    or view) and returns what goes into the state (the ``into=`` hook).

    Raises:
        FormatError: the skeleton is malformed or refers to tensors that do not exist.
    """

    def hook(tag: dict[str, JsonValue], path: str) -> object:
        if set(tag) == {"$tensor"} and isinstance(tag["$tensor"], str):
            tensor = lookup(tag["$tensor"], path)
        elif set(tag) == {"$view"} and isinstance(tag["$view"], dict):
            tensor = _rebuild_view(tag["$view"], path, lookup)
        else:
            raise FormatError(f"{path}: malformed tensor reference {tag!r}")
        return tensor if finish is None else finish(tensor, path)

    return typed_json.decode(skeleton, hook=hook)


def tensor_references(skeleton: JsonValue) -> dict[str, list[str]]:
    """Return ``{stored name: [key paths referencing it]}`` without loading anything."""
    found: dict[str, list[str]] = {}

    def hook(tag: dict[str, JsonValue], path: str) -> object:
        ref = tag.get("$tensor")
        view = tag.get("$view")
        if isinstance(ref, str):
            found.setdefault(ref, []).append(path)
        elif isinstance(view, dict) and isinstance(view.get("storage"), str):
            found.setdefault(str(view["storage"]), []).append(path)
        else:
            raise FormatError(f"{path}: malformed tensor reference {tag!r}")
        return None

    typed_json.decode(skeleton, hook=hook)
    return found


def _rebuild_view(spec: dict[str, JsonValue], path: str, lookup: TensorLookup) -> torch.Tensor:
    import torch  # noqa: PLC0415 - see the module's imports

    storage, code = spec.get("storage"), spec.get("dtype")
    offset, shape, stride = spec.get("offset"), spec.get("shape"), spec.get("stride")
    if not (
        isinstance(storage, str)
        and isinstance(code, str)
        and _is_nat(offset)
        and isinstance(shape, list)
        and isinstance(stride, list)
        and len(shape) == len(stride)
        and all(_is_nat(v) for v in [*shape, *stride])
    ):
        raise FormatError(f"{path}: malformed view reference")
    blob = lookup(storage, path)
    size = itemsize(code)
    assert isinstance(offset, int)
    dims = list(validate_shape(shape, path))
    steps = list(validate_shape(stride, path))

    span = (
        0
        if math.prod(dims) == 0
        else sum((d - 1) * s for d, s in zip(dims, steps, strict=True)) + 1
    )
    if blob.dtype != torch.uint8 or blob.dim() != 1 or (offset + span) * size > blob.numel():
        raise FormatError(f"{path}: view reaches outside its shared storage {storage!r}")
    if blob.storage_offset() % size:
        raise FormatError(f"{path}: shared storage {storage!r} is misaligned for {code}")
    view = torch.empty(0, dtype=torch_dtype(code), device=blob.device)
    try:
        view.set_(blob.untyped_storage(), blob.storage_offset() // size + offset, dims, steps)
    except (RuntimeError, TypeError, OverflowError) as exc:
        raise FormatError(f"{path}: invalid view reference: {exc}") from None
    return view


def _is_nat(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


__all__ = [
    "STORAGE_PREFIX",
    "FlatState",
    "StoredTensor",
    "flatten_state",
    "iter_tensors",
    "tensor_references",
    "unflatten_state",
]
