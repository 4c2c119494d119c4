"""The async save's staging buffer: one reused host buffer holding a rank file's exact bytes.

An async save must copy the state before the training loop mutates it again.
Copying into the *final file image* (padded safetensors header, then every
tensor's bytes at its offset) makes that one copy serve twice: the background
writer hands the image to the tier as it is, page-aligned, so the O_DIRECT path
writes it without another copy (:class:`~mouthguard.tiers.base.StableChunks`).

Invariants:

* The buffer is page-aligned (an anonymous ``mmap``, or pinned memory from the
  CUDA allocator when any tensor lives on a GPU, so device-to-host copies run
  asynchronously at full PCIe speed).
* It is reused across saves and only grows (in 16 MiB steps): after the first
  save its pages are resident, so later snapshots cost a memcpy and no page
  faults, and repeated saves do not grow memory.
* The owner must not snapshot into it again before the previous image has been
  written; :class:`~mouthguard.checkpoint.async_save.AsyncSaver` enforces that
  with one save in flight.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import TYPE_CHECKING

from mouthguard.errors import FormatError
from mouthguard.format.rank_file import RankFileLayout
from mouthguard.format.state_tree import FlatState

# torch is imported where tensors are made: the checkpointer imports this module,
# and commands that only read manifests (the CLI's ls, verify) must not load torch.
if TYPE_CHECKING:
    import torch

#: Capacity grows in steps of this size, so small changes of the state reuse it.
GROWTH_STEP = 16 * 1024 * 1024


class StagingBuffer:
    """A growable, reusable, page-aligned host buffer (pinned when tensors are on CUDA)."""

    def __init__(self) -> None:
        self._memory: mmap.mmap | None = None
        self._tensor: torch.Tensor | None = None
        self._pinned = False

    @property
    def capacity(self) -> int:
        """Bytes currently reserved (0 before the first save)."""
        return 0 if self._tensor is None else self._tensor.numel()

    @property
    def pinned(self) -> bool:
        """Whether the buffer is page-locked CUDA host memory."""
        return self._pinned

    def reserve(self, nbytes: int, *, pinned: bool) -> torch.Tensor:
        """A uint8 tensor of exactly ``nbytes`` over the buffer (reallocated only to grow)."""
        import torch  # noqa: PLC0415 - see the module's imports

        if self._tensor is None or self.capacity < nbytes or self._pinned != pinned:
            self.release()  # free the old buffer first: never hold two at once
            capacity = max(-(-nbytes // GROWTH_STEP) * GROWTH_STEP, GROWTH_STEP)
            if pinned:
                self._tensor = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)
            else:
                self._memory = mmap.mmap(-1, capacity)
                self._tensor = torch.frombuffer(self._memory, dtype=torch.uint8)
            self._pinned = pinned
        return self._tensor[:nbytes]

    def prefault(self) -> None:
        """Touch every page of the buffer so the next snapshot pays no page faults.

        A fresh anonymous mapping is backed lazily: the first snapshot into it would
        fault in every page (several times a memcpy's cost on a VM). Pinned memory
        is resident from its allocation; touching it costs one write per page.
        """
        if self._tensor is not None and self._tensor.numel():
            self._tensor[:: mmap.PAGESIZE].zero_()

    def release(self) -> None:
        """Give the memory back (the next ``reserve`` allocates again)."""
        self._tensor = None
        if self._memory is not None:
            # torch.frombuffer keeps an export of the mmap alive until the tensor is
            # collected; closing may fail then, and the GC unmaps it instead.
            with contextlib.suppress(BufferError):
                self._memory.close()
            self._memory = None
        self._pinned = False


def needs_pinned(flat: FlatState) -> bool:
    """Whether any tensor is on a CUDA device (staging then uses pinned memory)."""
    return any(t.tensor.device.type == "cuda" for t in flat.tensors)


def snapshot(flat: FlatState, layout: RankFileLayout, image: torch.Tensor) -> None:
    """Copy the header and every tensor of ``flat`` into ``image`` (the rank-file image).

    ``image`` must be exactly ``layout.size`` bytes. Device tensors are copied
    asynchronously into pinned memory and synchronised once at the end; the
    caller may change the state as soon as this returns.

    Raises:
        FormatError: a tensor no longer matches the layout (changed meanwhile).
    """
    import torch  # noqa: PLC0415 - see the module's imports

    if image.numel() != layout.size:
        raise FormatError(f"staging image has {image.numel()} bytes, layout needs {layout.size}")
    header = torch.frombuffer(bytearray(layout.header), dtype=torch.uint8)
    image[: layout.data_offset].copy_(header)
    on_device = False
    for stored, entry in zip(flat.tensors, layout.entries, strict=True):
        tensor = stored.tensor.detach()
        if tensor.numel() * tensor.element_size() != entry.length:
            raise FormatError(f"tensor {stored.name!r} changed size while being saved")
        if entry.length == 0:
            continue
        source = tensor if tensor.is_contiguous() else tensor.contiguous()
        on_device = on_device or source.device.type != "cpu"
        image[entry.offset : entry.end].copy_(
            source.reshape(-1).view(torch.uint8), non_blocking=source.device.type != "cpu"
        )
    if on_device:
        torch.cuda.synchronize()
