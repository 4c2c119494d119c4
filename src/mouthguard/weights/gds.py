"""GPUDirect Storage through kvikio: the disk writes straight into GPU memory, when it can.

GDS skips the host entirely (no bounce through pinned memory, no CPU copy), but
it needs the kvikio package, NVIDIA's ``nvidia-fs`` driver and a filesystem that
supports it. kvikio itself falls back to POSIX reads through its own bounce
buffers ("compatibility mode") when the driver is missing; that path is no
faster than mouthguard's own ring, so mouthguard uses kvikio only when it is
*not* in compatibility mode, and says why not otherwise.

GDS bytes never pass through host memory, so they cannot be checksummed on the
way: a file with a checksum to verify is always read through the ring (see
:func:`mouthguard.weights.loader.load`). GDS serves unverifiable files (a
Hugging Face directory) or loads with ``verify=False``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def gds_status() -> tuple[bool, str]:
    """Whether GPUDirect Storage can be used in this process, and why (not)."""
    try:
        import kvikio  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
    except ImportError:
        return False, "kvikio is not installed"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install fails on import: fall back
        return False, f"kvikio failed to load ({type(exc).__name__}: {exc})"
    defaults: Any = kvikio.defaults
    preferred = getattr(defaults, "is_compat_mode_preferred", None)
    try:
        compat = preferred() if callable(preferred) else _compat_from_mode(defaults)
    except Exception as exc:  # noqa: BLE001 - a driver probe failing means no GDS, not an error
        return False, f"kvikio cannot tell whether GDS works ({exc})"
    if compat:
        return False, (
            "kvikio is in compatibility mode (no nvidia-fs driver or no filesystem support): "
            "reading through mouthguard's pinned ring instead"
        )
    return True, "GPUDirect Storage through kvikio"


def _compat_from_mode(defaults: Any) -> bool:
    mode = defaults.compat_mode()
    if isinstance(mode, bool):
        return mode
    return getattr(mode, "name", str(mode)).upper() != "OFF"


def read_ranges_gds(path: Path, ranges: list[tuple[int, int, torch.Tensor]]) -> int:
    """Read each ``(file offset, length, flat uint8 CUDA tensor)`` with GDS; bytes read.

    Raises:
        OSError: a read came back short.
    """
    import kvikio  # noqa: PLC0415 - only reached when gds_status() said yes

    total = 0
    with kvikio.CuFile(path, "r") as handle:
        futures = [
            (handle.pread(dest, length, file_offset=offset), length)
            for offset, length, dest in ranges
        ]
        for future, length in futures:
            got = int(future.get())
            if got != length:
                raise OSError(f"{path}: GPUDirect read returned {got} of {length} bytes")
            total += got
    return total
