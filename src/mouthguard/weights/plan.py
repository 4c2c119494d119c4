"""What to read from each weight file: its header, the tensors wanted, and the reads.

For each file the header is read and parsed as hostile input
(:func:`mouthguard.format.rank_file.parse_header`: size caps, strict JSON, tensors
tiling the data region exactly). Each wanted tensor becomes a :class:`Wanted`:
its byte ranges in the file, whose concatenation is the bytes of what is
returned (the whole tensor, or this rank's tensor-parallel slice).

The ranges are then cut into :class:`Read` s of at most one ring slot each, in
file order. A read covers a contiguous span; the :class:`ReadPart` s of it that some
tensor wants say where its bytes go. When the file is verified the spans cover
its whole data region (a checksum is over every byte, so every byte is read,
also those no tensor wants); otherwise only the wanted ranges are read, with
gaps shorter than :data:`GAP_MERGE_BYTES` read through rather than split into
many small reads (a row-parallel slice is one short range per row).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from mouthguard.errors import WeightsError
from mouthguard.format.dtypes import is_known_code, itemsize
from mouthguard.format.rank_file import TensorEntry, parse_header, read_header_length
from mouthguard.tiers.base import Tier
from mouthguard.weights.sharding import Split, TensorParallel, slice_ranges
from mouthguard.weights.source import WeightFile

#: Gaps between wanted ranges shorter than this are read rather than skipped.
GAP_MERGE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Wanted:
    """One tensor to return: where its bytes are in the file, and its final shape.

    Attributes:
        entry: the tensor as the file's header describes it.
        split: this rank's tensor-parallel slice, or None for the whole tensor.
        ranges: absolute ``(offset, length)`` ranges in the file, in order.
    """

    entry: TensorEntry
    split: Split | None
    ranges: tuple[tuple[int, int], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the returned tensor."""
        return self.entry.shape if self.split is None else self.split.shape(self.entry.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the returned tensor."""
        return sum(length for _, length in self.ranges)


@dataclass(frozen=True)
class ReadPart:
    """Bytes ``[start, start + length)`` of a read go to ``wanted`` at ``dest_offset``."""

    start: int
    length: int
    wanted: int
    dest_offset: int


@dataclass
class Read:
    """One ranged read of at most one ring slot, and where its bytes go."""

    offset: int
    length: int
    parts: list[ReadPart] = field(default_factory=list)


@dataclass(frozen=True)
class FilePlan:
    """Everything to read from one file.

    Attributes:
        file: the file and its checksums.
        size: its size in bytes.
        header: its header bytes ``[0, data_offset)`` (hashed first when verifying).
        wanted: the tensors to return, in file order.
        verify: whether every byte is read and checked against ``file.checksum``.
    """

    file: WeightFile
    size: int
    header: bytes
    wanted: tuple[Wanted, ...]
    verify: bool

    @property
    def data_offset(self) -> int:
        """Where the tensor bytes start."""
        return len(self.header)

    def reads(self, slot_bytes: int) -> list[Read]:
        """The reads, in file order, each at most ``slot_bytes`` (see the module docstring)."""
        return _cut(self._spans(), self._segments(), slot_bytes)

    def _segments(self) -> list[tuple[int, int, int, int]]:
        """``(offset, length, wanted index, dest offset)`` of every wanted range, by offset."""
        segments = []
        for index, wanted in enumerate(self.wanted):
            dest = 0
            for offset, length in wanted.ranges:
                segments.append((offset, length, index, dest))
                dest += length
        return sorted(segments)

    def _spans(self) -> list[tuple[int, int]]:
        """Contiguous ``(start, end)`` regions to read."""
        if self.verify:
            return [(self.data_offset, self.size)] if self.size > self.data_offset else []
        spans: list[tuple[int, int]] = []
        for offset, length, _, _ in self._segments():
            if spans and offset - spans[-1][1] < GAP_MERGE_BYTES:
                spans[-1] = (spans[-1][0], max(spans[-1][1], offset + length))
            else:
                spans.append((offset, offset + length))
        return spans


def _cut(
    spans: list[tuple[int, int]], segments: list[tuple[int, int, int, int]], slot_bytes: int
) -> list[Read]:
    reads = [
        Read(offset, min(slot_bytes, end - offset))
        for start, end in spans
        for offset in range(start, end, slot_bytes)
    ]
    # Both lists are sorted by offset: walk them together.
    cursor = 0
    for seg_offset, seg_length, wanted, dest in segments:
        seg_end = seg_offset + seg_length
        while cursor < len(reads) and reads[cursor].offset + reads[cursor].length <= seg_offset:
            cursor += 1
        index = cursor
        while index < len(reads) and reads[index].offset < seg_end:
            read = reads[index]
            low, high = max(seg_offset, read.offset), min(seg_end, read.offset + read.length)
            read.parts.append(
                ReadPart(low - read.offset, high - low, wanted, dest + low - seg_offset)
            )
            index += 1
    return reads


def plan_file(
    tier: Tier,
    file: WeightFile,
    *,
    verify: bool,
    parallel: TensorParallel | None,
    include: Sequence[str] | None,
) -> FilePlan:
    """Read and check ``file``'s header; plan the tensors wanted from it.

    ``include`` narrows the tensors further (``fnmatch`` patterns of names, any
    matching; None: every tensor the source wants).

    Raises:
        RankFileError: the header is malformed.
        WeightsError: the source's index names a tensor the file does not hold, or
            a wanted tensor has a dtype code mouthguard does not map.
        TierError: the file cannot be read.
    """
    size = tier.head(file.key).size
    head = tier.get(file.key, 0, min(size, 8))
    data_offset = read_header_length(head, size)
    header = tier.get(file.key, 0, data_offset)
    # A tensor of a dtype mouthguard cannot build is refused only if it is wanted.
    entries, _ = parse_header(header, size, unknown_dtypes=True)
    names = {e.name for e in entries}
    if file.tensors is not None and not file.tensors <= names:
        missing = sorted(file.tensors - names)
        raise WeightsError(f"{file.name}: the index maps {missing[:5]} here, but it lacks them")
    chosen = [
        e
        for e in entries
        if (file.tensors is None or e.name in file.tensors)
        and (include is None or any(fnmatch.fnmatchcase(e.name, p) for p in include))
    ]
    unknown = [e for e in chosen if not is_known_code(e.dtype)]
    if unknown:
        listed = ", ".join(f"{e.name!r} ({e.dtype})" for e in unknown[:5])
        raise WeightsError(
            f"{file.name}: tensor(s) {listed} have a dtype mouthguard cannot load; "
            "leave them out with include="
        )
    wanted = []
    for entry in chosen:
        split = parallel.split_for(entry.name, entry.shape) if parallel is not None else None
        ranges: tuple[tuple[int, int], ...]
        if split is None:
            ranges = ((entry.offset, entry.length),) if entry.length else ()
        else:
            ranges = tuple(
                (entry.offset + offset, length)
                for offset, length in slice_ranges(entry.shape, itemsize(entry.dtype), split)
            )
        wanted.append(Wanted(entry, split, ranges))
    return FilePlan(file, size, header, tuple(wanted), verify)
