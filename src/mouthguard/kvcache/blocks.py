"""KV blocks as bytes: what a block was, its private byte copy, and its checksum.

A caller hands the store a numpy array or a torch tensor (CPU or CUDA). The store
keeps a :class:`Payload`: a private, contiguous ``uint8`` copy of the bytes, a
:class:`BlockDesc` saying how to rebuild the array (kind, dtype, shape), and an
xxh3-128 checksum over the block's key followed by its bytes. Binding the key
into the checksum means a payload read from the wrong place (another block's
record, a recycled offset) fails exactly like a flipped bit.

Contracts:

* :func:`encode` never aliases the caller's memory: the caller may reuse its
  buffer (a paged GPU KV pool) as soon as ``put`` has returned.
* :func:`decode` returns an array of the recorded kind, dtype and shape, or fills
  the caller's buffer (same byte size) and returns it; with ``device=`` a torch
  tensor on that device.
* :func:`parse_desc` treats the bytes as hostile (they come from an index file on
  disk or a remote object): unknown kinds and dtypes, absurd ranks and sizes are
  :class:`FormatError`, never an exception from deep inside numpy.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import xxhash

from mouthguard.errors import FormatError, KVCacheError
from mouthguard.io.direct_write import ALIGN

#: What a block may be: a numpy array or a torch tensor.
Block = Any
_KINDS = ("numpy", "torch")
_MAX_NDIM = 8
_TORCH_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
}


@dataclass(frozen=True)
class BlockDesc:
    """How to rebuild a block from its bytes."""

    kind: str  # "numpy" or "torch"
    dtype: str  # numpy: dtype.str ("<f4"); torch: the dtype's name ("bfloat16")
    shape: tuple[int, ...]

    def encode(self) -> bytes:
        """Compact binary form: kind, dtype, rank, dims (little-endian)."""
        return _encoded_desc(self)


@functools.lru_cache(maxsize=256)
def _encoded_desc(desc: BlockDesc) -> bytes:
    # Every record and object of a block shape carries the same bytes: made once.
    name = desc.dtype.encode("ascii")
    head = struct.pack("<BB", _KINDS.index(desc.kind), len(name)) + name
    return head + struct.pack(f"<B{len(desc.shape)}Q", len(desc.shape), *desc.shape)


def padded(nbytes: int) -> int:
    """Bytes a payload occupies on disk and in its frame (whole 4 KiB units, at least one)."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def aligned_frame(nbytes: int) -> npt.NDArray[Any]:
    """A zeroed-tail, 4 KiB-aligned uint8 buffer of ``padded(nbytes)`` bytes.

    A payload kept in one is written to disk as it is, O_DIRECT included, with
    no bounce copy (:func:`~mouthguard.kvcache.segments.write_payloads`).
    """
    span = padded(nbytes)
    raw = np.empty(span + ALIGN, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % ALIGN
    frame = raw[start : start + span]
    frame[nbytes:] = 0
    return frame


@dataclass(frozen=True)
class Payload:
    """A block's private bytes, description and checksum (see the module docstring).

    ``frame``, when present, is the aligned, zero-padded buffer whose first
    ``nbytes`` are ``data`` (see :func:`aligned_frame`).
    """

    data: npt.NDArray[Any]  # 1-D uint8, owned by the store, never written after creation
    desc: BlockDesc
    checksum: bytes  # xxh3-128 of key || data
    frame: npt.NDArray[Any] | None = None

    @property
    def nbytes(self) -> int:
        """Size of the block's bytes."""
        return int(self.data.nbytes)


@functools.lru_cache(maxsize=256)
def _desc(kind: str, dtype: str, shape: tuple[int, ...]) -> BlockDesc:
    # One description per block shape in use (immutable, shared by every payload).
    return BlockDesc(kind, dtype, tuple(int(d) for d in shape))


def block_checksum(key: bytes, data: npt.NDArray[Any] | memoryview) -> bytes:
    """xxh3-128 over ``key`` then the bytes of ``data``."""
    hasher = xxhash.xxh3_128()
    hasher.update(key)
    hasher.update(memoryview(data).cast("B") if isinstance(data, memoryview) else data.data)
    return hasher.digest()


def encode(key: bytes, block: Block) -> Payload:
    """Copy ``block`` into a private :class:`Payload` (device blocks come to host memory).

    Raises:
        KVCacheError: ``block`` is neither a numpy array nor a torch tensor, or has
            a dtype the store cannot rebuild.
    """
    if isinstance(block, torch.Tensor):
        name = str(block.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise KVCacheError(f"unsupported torch dtype {block.dtype} for a KV block")
        flat = block.detach().contiguous().reshape(-1).view(torch.uint8)
        frame = aligned_frame(flat.numel())
        data = frame[: flat.numel()]
        # One copy either way: device -> host, or host -> the store's own buffer.
        torch.from_numpy(data).copy_(flat)
        desc = _desc("torch", name, tuple(block.shape))
    elif isinstance(block, np.ndarray):
        if block.dtype.kind not in "biufc" or block.dtype.hasobject:
            raise KVCacheError(f"unsupported numpy dtype {block.dtype} for a KV block")
        frame = aligned_frame(block.nbytes)
        data = frame[: block.nbytes]
        source = block if block.flags.c_contiguous else np.ascontiguousarray(block)
        np.copyto(data, source.reshape(-1).view(np.uint8))
        desc = _desc("numpy", block.dtype.str, block.shape)
    else:
        raise KVCacheError(f"a KV block must be a numpy array or torch tensor, got {type(block)}")
    return Payload(data, desc, block_checksum(key, data), frame)


@functools.lru_cache(maxsize=64)
def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if name not in _TORCH_DTYPES or not isinstance(dtype, torch.dtype):
        raise FormatError(f"unknown torch dtype {name!r} in a KV block description")
    return dtype


@functools.lru_cache(maxsize=64)
def _numpy_dtype(name: str) -> np.dtype[Any]:
    try:
        dtype = np.dtype(name)
    except TypeError as exc:
        raise FormatError(f"unknown numpy dtype {name!r} in a KV block description") from exc
    if dtype.kind not in "biufc" or dtype.hasobject or dtype.str != name:
        raise FormatError(f"unusable numpy dtype {name!r} in a KV block description")
    return dtype


def itemsize(desc: BlockDesc) -> int:
    """Bytes per element of ``desc``'s dtype."""
    if desc.kind == "torch":
        return int(_torch_dtype(desc.dtype).itemsize)
    return int(_numpy_dtype(desc.dtype).itemsize)


def expected_nbytes(desc: BlockDesc) -> int:
    """The byte size a block of ``desc`` must have."""
    return itemsize(desc) * int(np.prod(desc.shape, dtype=np.int64))


def parse_desc(raw: bytes, nbytes: int) -> BlockDesc:
    """Decode :meth:`BlockDesc.encode` output, checked against the payload's size.

    Raises:
        FormatError: malformed, unknown dtype, or a shape that does not match ``nbytes``.
    """
    try:
        kind_index, name_len = struct.unpack_from("<BB", raw, 0)
        name = raw[2 : 2 + name_len].decode("ascii")
        (ndim,) = struct.unpack_from("<B", raw, 2 + name_len)
        if ndim > _MAX_NDIM:
            raise FormatError(f"KV block of rank {ndim}")
        dims = struct.unpack_from(f"<{ndim}Q", raw, 3 + name_len)
        if 3 + name_len + 8 * ndim != len(raw):
            raise FormatError("trailing bytes after a KV block description")
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise FormatError(f"malformed KV block description: {exc}") from exc
    if kind_index >= len(_KINDS):
        raise FormatError(f"unknown KV block kind {kind_index}")
    desc = BlockDesc(_KINDS[kind_index], name, tuple(int(d) for d in dims))
    if expected_nbytes(desc) != nbytes:
        raise FormatError(f"KV block shape {desc.shape} x {desc.dtype} is not {nbytes} bytes")
    return desc


def decode(
    data: npt.NDArray[Any], desc: BlockDesc, *, out: Block | None = None, device: Any = None
) -> Block:
    """Rebuild a block from bytes the caller owns (see the module docstring).

    ``data`` is used as the result's memory when no ``out`` is given, so it must
    not be shared with the store.

    Raises:
        KVCacheError: ``out`` has another byte size than the block.
    """
    if out is not None:
        return _fill(out, data)
    if desc.kind == "torch" or device is not None:
        if desc.kind == "torch":
            tensor = torch.from_numpy(data).view(_torch_dtype(desc.dtype)).reshape(desc.shape)
        else:
            tensor = torch.from_numpy(data.view(_numpy_dtype(desc.dtype)).reshape(desc.shape))
        return tensor.to(device) if device is not None else tensor
    return data.view(_numpy_dtype(desc.dtype)).reshape(desc.shape)


def rebuild(data: npt.NDArray[Any], desc: BlockDesc) -> Block:
    """:func:`decode` without ``out`` or ``device``: a view of ``data`` as the block."""
    if desc.kind == "torch":
        return torch.from_numpy(data).view(_torch_dtype(desc.dtype)).reshape(desc.shape)
    return data.view(_numpy_dtype(desc.dtype)).reshape(desc.shape)


def _fill(out: Block, data: npt.NDArray[Any]) -> Block:
    if isinstance(out, torch.Tensor):
        if out.nbytes != data.nbytes or not out.is_contiguous():
            raise KVCacheError(f"out buffer of {out.nbytes} bytes for a {data.nbytes}-byte block")
        out.view(-1).view(torch.uint8).copy_(torch.from_numpy(data))
        return out
    if isinstance(out, np.ndarray):
        if out.nbytes != data.nbytes or not out.flags.c_contiguous or not out.flags.writeable:
            raise KVCacheError(f"out buffer of {out.nbytes} bytes for a {data.nbytes}-byte block")
        out.reshape(-1).view(np.uint8)[:] = data
        return out
    raise KVCacheError(f"out buffers must be numpy arrays or torch tensors, got {type(out)}")
