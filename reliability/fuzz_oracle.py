"""The accepted-corrupt oracle: what a load returned, checked against an independent reader.

A load that succeeds must hand back, for every tensor reference of the manifest's
skeleton, exactly the bytes that the *real* safetensors library finds under that
name in the rank file (views are rebuilt element by element from the shared blob).
A mismatch means mouthguard accepted a checkpoint and returned wrong bytes.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from mouthguard.format.dtypes import itemsize, torch_dtype

_MAX_CHECKED_ELEMENTS = 1 << 16


def independent_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a rank file as the safetensors library reads them."""
    try:
        return dict(safetensors.torch.load(data))
    except KeyError:
        # safetensors 0.8's in-memory reader lacks some codes its file reader has
        # (F8_E8M0): read those through a file.
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "rank.safetensors"
            path.write_bytes(data)
            return dict(safetensors.torch.load_file(str(path)))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    flat_a = a.contiguous().reshape(-1).view(torch.uint8)
    flat_b = b.contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(flat_a, flat_b))


def _view_matches(
    spec: dict[str, Any], loaded: torch.Tensor, stored: dict[str, torch.Tensor]
) -> bool:
    blob = stored.get(spec["storage"])
    if blob is None or blob.dtype != torch.uint8:
        return False
    dtype, size = torch_dtype(spec["dtype"]), itemsize(spec["dtype"])
    shape, stride, offset = list(spec["shape"]), list(spec["stride"]), int(spec["offset"])
    if loaded.dtype != dtype or list(loaded.shape) != shape:
        return False
    if math.prod(shape) > _MAX_CHECKED_ELEMENTS:
        return True  # too big to check element by element here; shapes agreed
    raw = blob.numpy().tobytes()
    got = loaded.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    for n, index in enumerate(itertools.product(*(range(d) for d in shape))):
        element = offset + sum(i * s for i, s in zip(index, stride, strict=True))
        if raw[element * size : (element + 1) * size] != got[n * size : (n + 1) * size]:
            return False
    return True


def compare(
    skeleton: Any, loaded: Any, stored: dict[str, torch.Tensor], path: str = ""
) -> str | None:
    """Return where ``loaded`` disagrees with ``skeleton`` + ``stored``, or None."""
    if isinstance(skeleton, dict):
        tags = [k for k in skeleton if k.startswith("$")]
        if tags == ["$tensor"] and len(skeleton) == 1:
            want = stored.get(skeleton["$tensor"])
            if not isinstance(loaded, torch.Tensor) or want is None or not _same(loaded, want):
                return f"{path}: loaded bytes differ from stored tensor {skeleton['$tensor']!r}"
            return None
        if tags == ["$view"] and len(skeleton) == 1:
            if not isinstance(loaded, torch.Tensor) or not _view_matches(
                skeleton["$view"], loaded, stored
            ):
                return f"{path}: loaded view differs from its stored blob"
            return None
        if tags == ["$tuple"]:
            return _compare_seq(skeleton["$tuple"], loaded, stored, path, tuple)
        if tags == ["$dict"]:
            if not isinstance(loaded, dict):
                return f"{path}: expected a dict"
            for key, value in skeleton["$dict"]:
                if key not in loaded:
                    return f"{path}: key {key!r} missing"
                problem = compare(value, loaded[key], stored, f"{path}[{key!r}]")
                if problem:
                    return problem
            return None
        if tags:
            return None  # $bytes, $float, $numpy, $size: values, not tensor bytes
        if not isinstance(loaded, dict) or list(loaded) != list(skeleton):
            return f"{path}: structure differs from the manifest"
        for key, value in skeleton.items():
            problem = compare(value, loaded[key], stored, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(skeleton, list):
        return _compare_seq(skeleton, loaded, stored, path, list)
    return None


def _compare_seq(
    items: list[Any], loaded: Any, stored: dict[str, torch.Tensor], path: str, kind: type
) -> str | None:
    if (
        not isinstance(loaded, list | tuple)
        or type(loaded) is not kind
        or len(loaded) != len(items)
    ):
        return f"{path}: expected a {kind.__name__} of {len(items)}"
    for index, (want, got) in enumerate(zip(items, loaded, strict=True)):
        problem = compare(want, got, stored, f"{path}[{index}]")
        if problem:
            return problem
    return None
