"""The mapping between torch dtypes and safetensors dtype codes.

Only dtypes that safetensors itself defines are stored, so every rank file opens
with any safetensors reader. Item sizes are kept here (not asked of torch at
parse time) so a hostile manifest can be validated without allocating anything,
and without importing torch: listing and verifying checkpoints never need it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from mouthguard.errors import FormatError

if TYPE_CHECKING:
    import torch

#: safetensors code -> (name of the torch dtype, item size in bytes)
_CODES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F32": ("float32", 4),
    "F64": ("float64", 8),
    "C64": ("complex64", 8),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
}


@functools.cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    """The torch dtype of each code; torch is imported on the first tensor conversion."""
    import torch  # noqa: PLC0415 - only code paths that build tensors pay for torch

    # A torch too old for a dtype simply cannot build such tensors (torch_dtype says so).
    return {
        code: getattr(torch, name) for code, (name, _) in _CODES.items() if hasattr(torch, name)
    }


@functools.cache
def _codes_by_dtype() -> dict[torch.dtype, str]:
    return {dtype: code for code, dtype in _torch_dtypes().items()}


def dtype_code(dtype: torch.dtype) -> str:
    """Return the safetensors code of ``dtype``.

    Raises:
        FormatError: safetensors cannot carry this dtype.
    """
    try:
        return _codes_by_dtype()[dtype]
    except KeyError:
        raise FormatError(f"dtype {dtype} cannot be stored in a safetensors file") from None


def torch_dtype(code: str) -> torch.dtype:
    """Return the torch dtype for a safetensors code, or raise FormatError."""
    try:
        return _torch_dtypes()[code]
    except (KeyError, TypeError):
        if isinstance(code, str) and code in _CODES:
            raise FormatError(
                f"tensor dtype {code} needs torch.{_CODES[code][0]}, which this torch lacks"
            ) from None
        raise FormatError(f"unknown tensor dtype code {code!r}") from None


def is_known_code(code: object) -> bool:
    """Whether ``code`` is a safetensors dtype code this module maps (``"F8_E8M0"``...)."""
    return isinstance(code, str) and code in _CODES


def itemsize(code: str) -> int:
    """Return the item size in bytes of a safetensors code, or raise FormatError."""
    try:
        return _CODES[code][1]
    except (KeyError, TypeError):
        raise FormatError(f"unknown tensor dtype code {code!r}") from None


#: Most dimensions a stored tensor may have.
MAX_DIMS = 64
#: Largest single dimension accepted from stored metadata (2**50: a PiB of bytes).
MAX_DIM = 1 << 50
#: Bound on the product of dims (zeros counted as 1): torch computes strides in
#: int64, so an *empty* tensor with a huge other dimension must be refused too.
MAX_DIM_PRODUCT = 1 << 62


def validate_shape(shape: object, where: str) -> tuple[int, ...]:
    """Return ``shape`` as a tuple if torch can build it safely, else raise FormatError.

    Hostile metadata can describe an empty tensor (one dim 0) whose other dims are
    beyond int64; its byte length is 0, so a length check alone lets it through to
    ``torch.empty``, which then fails with an overflow instead of a clear error.
    """
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise FormatError(f"{where}: malformed shape {shape!r}")
    product = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim <= MAX_DIM:
            raise FormatError(f"{where}: malformed shape {shape!r}")
        product *= max(dim, 1)
        if product > MAX_DIM_PRODUCT:
            raise FormatError(f"{where}: shape {shape!r} is too large")
    return tuple(int(d) for d in shape)


def is_supported(dtype: torch.dtype) -> bool:
    """Whether tensors of ``dtype`` can be stored."""
    return dtype in _codes_by_dtype()
