"""Rank files: valid safetensors files whose header is padded to a 4 KiB boundary.

Layout (the safetensors format, constrained)::

    [8 bytes: little-endian u64 N][N bytes: JSON header, space padded][tensor bytes]

``8 + N`` is a multiple of :data:`HEADER_ALIGN`, so the data region starts on a
4 KiB boundary and can be written and read with O_DIRECT. Tensor bytes are laid
out back to back in header order with no gaps and nothing after the last one,
because safetensors readers reject files whose data region is not exactly
covered. The JSON header maps each tensor name to ``dtype``, ``shape`` and
``data_offsets`` (relative to the data region) and may carry ``__metadata__``
(a str -> str map).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mouthguard.errors import FormatError, RankFileError
from mouthguard.format import strict_json
from mouthguard.format.dtypes import is_known_code, itemsize, validate_shape

if TYPE_CHECKING:
    import torch

HEADER_ALIGN = 4096
#: Upper bound on a header we agree to parse; safetensors itself caps it at 100 MB.
MAX_HEADER_BYTES = 100_000_000
_METADATA_KEY = "__metadata__"
#: Deepest JSON nesting accepted in a header: serde_json (safetensors' parser) stops
#: at 128 levels; we stop earlier, as our own headers are three levels deep.
MAX_HEADER_DEPTH = 64


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in a rank file.

    Attributes:
        name: the tensor's name in the safetensors header.
        dtype: safetensors dtype code (``F32``, ``BF16``, ...).
        shape: tensor shape.
        offset: absolute byte offset of the tensor's first byte in the file.
        length: number of bytes (``prod(shape) * itemsize``).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int

    @property
    def end(self) -> int:
        """Absolute offset one past the tensor's last byte."""
        return self.offset + self.length


@dataclass(frozen=True)
class RankFileLayout:
    """The header bytes and tensor placement of one rank file."""

    header: bytes
    entries: tuple[TensorEntry, ...]

    @property
    def data_offset(self) -> int:
        """Absolute offset of the data region (a multiple of HEADER_ALIGN)."""
        return len(self.header)

    @property
    def size(self) -> int:
        """Total file size in bytes."""
        return self.data_offset + sum(e.length for e in self.entries)


def expected_length(dtype: str, shape: Sequence[int]) -> int:
    """Byte length of a tensor of ``dtype`` and ``shape`` (validating both)."""
    return math.prod(shape) * itemsize(dtype)


def build_layout(
    tensors: Sequence[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]
) -> RankFileLayout:
    """Lay out ``(name, dtype_code, shape)`` tensors back to back after a padded header.

    Args:
        tensors: tensors in file order; names must be unique and not ``__metadata__``.
        metadata: string metadata stored in the header (``__metadata__``).
    """
    header: dict[str, object] = {_METADATA_KEY: dict(metadata)} if metadata else {}
    relative = 0
    sized: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for name, dtype, shape in tensors:
        if name == _METADATA_KEY or name in header:
            raise RankFileError(f"duplicate or reserved tensor name {name!r}")
        length = expected_length(dtype, shape)
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [relative, relative + length],
        }
        sized.append((name, dtype, shape, relative, length))
        relative += length
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    total = -(-(8 + len(text)) // HEADER_ALIGN) * HEADER_ALIGN
    padded = text + b" " * (total - 8 - len(text))
    head = struct.pack("<Q", len(padded)) + padded
    entries = tuple(
        TensorEntry(name, dtype, shape, total + rel, length)
        for name, dtype, shape, rel, length in sized
    )
    return RankFileLayout(head, entries)


def read_header_length(prefix: bytes, file_size: int) -> int:
    """Return the data offset (``8 + N``) announced by the first 8 bytes of a rank file.

    Raises:
        RankFileError: the header length is absurd (larger than the file or the cap).
    """
    if len(prefix) < 8 or file_size < 8:
        raise RankFileError("rank file is shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > MAX_HEADER_BYTES or 8 + length > file_size:
        raise RankFileError(
            f"rank file header length {length} is absurd for a file of {file_size} bytes"
        )
    return 8 + int(length)


def parse_header(
    head: bytes, file_size: int, *, unknown_dtypes: bool = False
) -> tuple[tuple[TensorEntry, ...], dict[str, str]]:
    """Parse and validate the header bytes ``[0, data_offset)`` of a rank file.

    Checks what safetensors readers check (contiguous, exactly covering data,
    lengths matching dtype and shape) so that a file we accept is one they accept.
    With ``unknown_dtypes`` (a model file from elsewhere, of which a caller may
    want only some tensors), a tensor whose dtype code is not one
    :mod:`~mouthguard.format.dtypes` maps is accepted with the length its
    offsets give -- everything else about it still checked -- and it is the
    caller's to refuse it if it is wanted.

    Returns:
        The tensor entries sorted by offset, and the ``__metadata__`` map.

    Raises:
        RankFileError: anything about the header is malformed.
    """
    data_offset = read_header_length(head, file_size)
    if len(head) < data_offset:
        raise RankFileError("rank file header is truncated")
    try:
        # Strict like safetensors' own parser (no NaN/Infinity, no lone surrogates,
        # numbers a double holds, serde_json's nesting limit or less), so that a
        # file we accept is one every safetensors reader accepts.
        raw = strict_json.parse(
            head[8:data_offset],
            max_depth=MAX_HEADER_DEPTH,
            max_bytes=MAX_HEADER_BYTES,
            ints_within_double=True,
            first_byte=8,
            source="the file",
        )
    except strict_json.StrictJsonError as exc:
        raise RankFileError(f"rank file header is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise RankFileError("rank file header is not a JSON object")
    metadata = _string_map(raw.pop(_METADATA_KEY, {}))
    if metadata is None:
        raise RankFileError("rank file __metadata__ must map strings to strings")
    entries = [
        _parse_entry(name, info, data_offset, unknown_dtypes=unknown_dtypes)
        for name, info in raw.items()
    ]
    entries.sort(key=lambda e: (e.offset, e.end))
    cursor = data_offset
    for entry in entries:
        if entry.offset != cursor:
            raise RankFileError(
                f"tensor {entry.name!r} overlaps or leaves a gap at offset {cursor}"
            )
        cursor = entry.end
    if cursor != file_size:
        raise RankFileError(f"tensor data covers {cursor} bytes but the file has {file_size}")
    return tuple(entries), metadata


def _string_map(value: strict_json.JsonValue) -> dict[str, str] | None:
    """``value`` as a str -> str map, or None if it is not one (JSON keys are always str)."""
    if not isinstance(value, dict):
        return None
    strings = {k: v for k, v in value.items() if isinstance(v, str)}
    return strings if len(strings) == len(value) else None


def _parse_entry(
    name: object, info: object, data_offset: int, *, unknown_dtypes: bool
) -> TensorEntry:
    if not isinstance(name, str) or not isinstance(info, dict):
        raise RankFileError(f"malformed header entry {name!r}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise RankFileError(f"tensor {name!r}: dtype must be a string")
    try:
        shape = list(validate_shape(shape, f"tensor {name!r}"))
    except FormatError as exc:
        raise RankFileError(str(exc)) from None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise RankFileError(f"tensor {name!r}: malformed data_offsets {offsets!r}")
    if unknown_dtypes and not is_known_code(dtype):
        length = offsets[1] - offsets[0]  # no item size to check it against
    else:
        try:
            length = expected_length(dtype, shape)
        except FormatError as exc:
            raise RankFileError(f"tensor {name!r}: {exc}") from None
    if offsets[1] - offsets[0] != length:
        raise RankFileError(f"tensor {name!r}: data_offsets span does not match dtype and shape")
    return TensorEntry(name, dtype, tuple(shape), data_offset + offsets[0], length)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """Return the raw bytes of a contiguous CPU tensor as a flat memoryview (no copy)."""
    import torch  # noqa: PLC0415 - parsing headers (ls, verify) must not import torch

    assert tensor.is_contiguous()
    assert tensor.device.type == "cpu"
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    array: Any = flat.view(torch.uint8).numpy()  # numpy arrays are buffers; stubs disagree
    return memoryview(array).cast("B")
