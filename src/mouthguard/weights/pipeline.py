"""Executing a file's reads: parallel ranged reads, the checksum inline, copies to the device.

One file's :class:`~mouthguard.weights.plan.Read` s are issued through
:func:`~mouthguard.io.host_ring.read_landings` (several in flight on the
process's one I/O pool, :mod:`~mouthguard.io.pool`, handed back in file order), so
the checksum sees the bytes in order as they land and verification costs no
second pass. Where each read lands:

* straight in the returned tensor, when the tensor is in host memory and the
  read is all one tensor's bytes (no copy at all);
* otherwise in a slot of a :class:`~mouthguard.io.host_ring.HostRing`
  (pinned for CUDA), from which each part is copied to its tensor -- for CUDA
  asynchronously, while the next reads fill the next slots.

So the disk, the checksum and the bus work at the same time, and host memory
beyond the returned tensors is the ring's, whatever the model's size.

Contract: when :func:`read_file` returns, every byte of the plan is in its
tensor (device copies finished) and, for a verified plan, the file's checksum
matched. When it raises, the tensors' contents are undefined and must not be
used; :func:`~mouthguard.weights.loader.load` returns none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mouthguard.errors import ChecksumMismatchError
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.rank_file import byte_view
from mouthguard.io.host_ring import HostRing, Landing, read_landings
from mouthguard.tiers.base import Tier
from mouthguard.weights.plan import FilePlan, Read

if TYPE_CHECKING:
    import torch

#: Reads in flight per file (a ring then has this many slots plus one).
READS_AHEAD = 4


def read_file(
    tier: Tier,
    plan: FilePlan,
    reads: list[Read],
    outputs: list[torch.Tensor],
    ring: HostRing | None,
) -> int:
    """Do ``reads`` (``plan.reads(...)``) into ``outputs`` (flat uint8, one per wanted); bytes read.

    ``ring`` carries every read that cannot land in its tensor directly; it may be
    None only when every output is in host memory and no read needs a bounce
    (checked: a plan that needs one raises ``ValueError``).

    Raises:
        ChecksumMismatchError: a verified file's bytes do not match its checksum.
        TierError: the file cannot be read.
    """
    hasher = StreamHasher(with_sha256=plan.file.sha256 is not None) if plan.verify else None
    if hasher is not None:
        hasher.update(plan.header)
    total = 0
    landings = (_landing(read, outputs) for read in reads)
    for view in read_landings(tier, plan.file.key, landings, ring, ahead=READS_AHEAD):
        if hasher is not None:
            hasher.update(view)
        total += view.nbytes
    if hasher is not None:
        check_file(plan, hasher)
    return total


def _landing(read: Read, outputs: list[torch.Tensor]) -> Landing:
    direct = _direct(read, outputs)
    if direct is not None:
        return Landing(read.offset, read.length, direct=direct)
    parts = tuple(
        (p.start, p.length, outputs[p.wanted][p.dest_offset : p.dest_offset + p.length])
        for p in read.parts
    )
    return Landing(read.offset, read.length, parts=parts)


def needs_ring(reads: list[Read], outputs: list[torch.Tensor]) -> bool:
    """Whether some read cannot land straight in its tensor."""
    return any(_direct(read, outputs) is None for read in reads)


def _direct(read: Read, outputs: list[torch.Tensor]) -> memoryview | None:
    """The host tensor bytes a read can land in directly, if it is all one tensor's."""
    if len(read.parts) != 1:
        return None
    part = read.parts[0]
    out = outputs[part.wanted]
    if part.length != read.length or out.device.type != "cpu":
        return None
    return byte_view(out[part.dest_offset : part.dest_offset + part.length])


def check_file(plan: FilePlan, hasher: StreamHasher) -> None:
    """Raise :class:`ChecksumMismatchError` unless ``hasher`` (fed the whole file) matches."""
    file = plan.file
    if file.checksum is not None and hasher.xxh3 != file.checksum:
        raise ChecksumMismatchError(
            f"{file.name}: checksum mismatch (manifest {file.checksum}, read {hasher.xxh3})"
        )
    if file.sha256 is not None and hasher.sha256 != file.sha256:
        raise ChecksumMismatchError(f"{file.name}: sha256 mismatch (tampered or corrupt)")
