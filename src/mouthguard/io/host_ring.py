"""A small ring of host buffers through which bytes move between the disk and a device.

Moving a state between storage and GPU memory takes two hops: the disk and the
host, the host and the device. Done one after the other the disk idles while
the PCIe bus copies, and the whole state sits in host memory once. The ring
overlaps the hops and bounds the memory: ``slots`` buffers of ``slot_bytes``
each (pinned when the device is CUDA, so copies run asynchronously at full
bus speed), reused in rotation.

Invariants:

* A slot is handed out again (:meth:`HostRing.acquire`) only after the device
  copy that last used it has finished: a refill never overwrites bytes still
  being copied, and a copy never reads a slot being refilled.
* Host memory is ``slots * slot_bytes``, whatever the size of the state.
* Device copies are queued on the caller's current CUDA stream, so work the
  caller queues afterwards on that stream sees the bytes, and bytes the caller
  wrote before are what a device-to-host copy reads.

On the CPU (``device`` a CPU device) the same ring runs with plain buffers and
synchronous copies, which is how its ordering and bounds are tested without a GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mouthguard.format.rank_file import byte_view
from mouthguard.io.read_ahead import READ_AHEAD, read_in_order
from mouthguard.tiers.base import Tier

# torch is imported where tensors are made (see checkpoint/staging.py).
if TYPE_CHECKING:
    import torch

#: Default slot size: large enough to amortise a copy's launch and an O_DIRECT
#: read, small enough that four fit comfortably in pinned memory.
SLOT_BYTES = 16 * 1024 * 1024
#: Default number of slots: one being filled from the disk, one being copied, two queued.
SLOTS = 4


class HostRing:
    """``slots`` host buffers of ``slot_bytes``, pinned when ``device`` is CUDA.

    Args:
        device: the device the bytes come from or go to.
        slots: how many buffers (at least 2, so one fills while one copies).
        slot_bytes: the size of each buffer.
    """

    def __init__(
        self, device: torch.device, *, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES
    ) -> None:
        import torch  # noqa: PLC0415 - see the module's imports

        if slots < 2 or slot_bytes < 1:
            raise ValueError(f"a ring needs at least 2 slots of 1 byte, not {slots} x {slot_bytes}")
        self.device = device
        self.slot_bytes = slot_bytes
        self.pinned = device.type == "cuda"
        self._buffers = [
            torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=self.pinned) for _ in range(slots)
        ]
        self._events: list[Any] = [None] * slots
        #: How often a slot had to wait for its previous copy (for tests and reports).
        self.waits = 0

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def nbytes(self) -> int:
        """Host memory held by the ring."""
        return len(self._buffers) * self.slot_bytes

    def acquire(self, index: int) -> torch.Tensor:
        """Slot ``index % len(self)``, once the copy that last used it has finished."""
        slot = index % len(self._buffers)
        event = self._events[slot]
        if event is not None:
            if not event.query():
                self.waits += 1
            event.synchronize()
            self._events[slot] = None
        return self._buffers[slot]

    def to_device(
        self, index: int, dest: torch.Tensor, *, start: int = 0, nbytes: int | None = None
    ) -> None:
        """Queue the copy of slot ``index``'s bytes ``[start, start + nbytes)`` into ``dest``.

        ``dest`` is flat uint8 of ``nbytes`` (default: its own length). The slot is
        handed out again only once the copy finished (:meth:`acquire`).
        """
        slot = index % len(self._buffers)
        nbytes = dest.numel() if nbytes is None else nbytes
        dest.copy_(self._buffers[slot][start : start + nbytes], non_blocking=self.pinned)
        self._record(slot)

    def from_device(self, index: int, source: torch.Tensor) -> int:
        """Queue the copy of ``source`` (flat uint8) into slot ``index``; return its bytes.

        The bytes are in the slot once :meth:`acquire` returns for the same index.
        """
        slot = index % len(self._buffers)
        nbytes = source.numel()
        self._buffers[slot][:nbytes].copy_(source, non_blocking=self.pinned)
        self._record(slot)
        return int(nbytes)

    def drain(self) -> None:
        """Wait for every copy in flight."""
        for slot in range(len(self._buffers)):
            self.acquire(slot)

    def _record(self, slot: int) -> None:
        if not self.pinned:
            return  # a CPU copy is synchronous: done when copy_ returned
        import torch  # noqa: PLC0415 - see the module's imports

        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.device))
        self._events[slot] = event


def device_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat uint8 tensor on its device (contiguous first if needed)."""
    import torch  # noqa: PLC0415 - see the module's imports

    source = tensor.detach()
    if not source.is_contiguous():
        source = source.contiguous()
    return source.reshape(-1).view(torch.uint8)


def stream_from_device(sources: Iterable[torch.Tensor], ring: HostRing) -> Iterator[memoryview]:
    """The bytes of ``sources`` (flat uint8 device tensors), in order, through ``ring``.

    Up to ``len(ring) - 1`` device-to-host copies are queued ahead of the chunk
    being handed out, so the bus copies while the consumer (a checksum and a
    disk write) works. Each yielded view is valid until the consumer asks for
    the next one: the consumer must have copied or written it by then, as a
    tier's ``put`` does with every chunk that is not ``StableChunks``.
    """
    chunks = (
        source[start : start + ring.slot_bytes]
        for source in sources
        for start in range(0, source.numel(), ring.slot_bytes)
    )
    queued: list[tuple[int, int]] = []  # (ring index, bytes), oldest first
    for issued, chunk in enumerate(chunks):
        ring.acquire(issued)
        queued.append((issued, ring.from_device(issued, chunk)))
        if len(queued) == len(ring):
            yield _filled(ring, *queued.pop(0))
    while queued:
        yield _filled(ring, *queued.pop(0))


def _filled(ring: HostRing, index: int, nbytes: int) -> memoryview:
    return byte_view(ring.acquire(index)[:nbytes])


@dataclass(frozen=True)
class Landing:
    """One ranged read of an object, and where its bytes go.

    Attributes:
        offset: where the read starts in the object.
        length: how many bytes it reads.
        direct: host memory of exactly ``length`` bytes the read fills itself (None:
            the read lands in a ring slot).
        parts: for a read through the ring, ``(start, length, dest)``: bytes
            ``[start, start + length)`` of the read are copied into ``dest`` (flat
            uint8, on the ring's device or the host) once the read landed.
    """

    offset: int
    length: int
    direct: memoryview | None = None
    parts: tuple[tuple[int, int, torch.Tensor], ...] = ()


def read_landings(
    tier: Tier,
    key: str,
    landings: Iterable[Landing],
    ring: HostRing | None,
    *,
    ahead: int = READ_AHEAD,
) -> Iterator[memoryview]:
    """Do every read of ``landings`` (``ahead`` in flight); yield each one's bytes in order.

    A read through the ring has its copies queued before its bytes are yielded, so
    the caller's checksum and the bus read the slot at the same time; the slot is
    refilled only once those copies finished. The yielded view is valid until the
    caller asks for the next one. When the generator is exhausted every copy has
    finished. ``ring`` must have at least ``ahead + 1`` slots and may be None only
    when every landing is direct.

    Raises:
        ValueError: a landing needs the ring and there is none, or the ring is too small.
        TierError: a read failed.
    """
    if ring is not None and len(ring) < ahead + 1:
        raise ValueError(f"a ring of {len(ring)} slots cannot take {ahead} reads in flight")
    queue: deque[tuple[Landing, int]] = deque()  # in job order: (landing, ring index or -1)

    def jobs() -> Iterator[tuple[int, memoryview]]:
        slot = 0
        for landing in landings:
            if landing.direct is not None:
                queue.append((landing, -1))
                yield landing.offset, landing.direct
                continue
            if ring is None:
                raise ValueError("a read that needs a bounce buffer, and no ring")
            buffer = ring.acquire(slot)
            queue.append((landing, slot))
            slot += 1
            yield landing.offset, byte_view(buffer[: landing.length])

    for view in read_in_order(tier, key, jobs(), ahead=ahead):
        landing, slot = queue.popleft()
        if slot >= 0 and ring is not None:
            for start, length, dest in landing.parts:
                ring.to_device(slot, dest, start=start, nbytes=length)
        yield view
    if ring is not None:
        ring.drain()
