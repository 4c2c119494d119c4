"""The order of an epoch, and who reads which part of it: pure arithmetic, no I/O.

**Global order.** From ``(seed, epoch)`` alone: the shards are permuted, cut
into blocks of ``window`` consecutive shards, and the samples of each block are
shuffled together (samples mix across ``window`` shards, while a reader needs
only one block's shards at a time). Without shuffling, blocks are single shards
in manifest order and samples stay in shard order. Random choices come from a
keyed 64-bit hash (splitmix64) of each position, so the order is fully specified
here -- it does not change with numpy's or Python's random number generators
between versions, and a run resumes in the same order after an upgrade.

**The shuffle of a block** is a *buffer shuffle* over the block's samples in
*arrival order* -- the order a reader streaming the block's shards front to back,
side by side, gets them: the shards' samples interleaved in proportion to their
counts (sample ``i`` of a shard of ``c`` at ``i / c``, ties in block order). The
buffer starts with :data:`BUFFER_START` samples and grows by one per sample
handed out (two taken in for one out) up to ``buffer`` samples; each position
takes a hash-chosen sample out of the buffer. So position ``k`` of a block
needs only the first ``min(buffer, BUFFER_START + k) + k + 1`` samples of the
arrival order: the first batch needs the first ranges of each shard, not samples
spread over the whole window (what a uniform permutation of the block needs).
The quality kept: once the buffer is full, each position draws uniformly from
``buffer`` samples (fewer while it grows, at the start of each block, as
webdataset's ``shuffle(bufsize, initial)`` does). ``buffer=0`` is the previous
order: a uniform permutation of the whole block (version 1 positions were taken
under it, and resume under it).

**Partitioning.** The epoch's ``N`` positions are split into contiguous spans
per rank, ``[r*N//R, (r+1)*N//R)`` (sizes differ by at most one; no padding, no
drops). Within a rank, positions from the resume point ``consumed`` on are cut
into batches of ``batch_size``, and DataLoader worker ``w`` of ``K`` takes
batches ``w, w+K, w+2K, ...``. A DataLoader collects batches from its workers
round-robin, in order, so the rank receives batch 0, 1, 2, ...: the rank's
sequence is the same for any number of workers, and every position of the epoch
goes to exactly one (rank, worker).

**Resume.** A rank that has delivered ``consumed`` samples of the epoch resumes
at rank position ``consumed``: nothing is replayed, nothing skipped, and the
samples that follow are those an uninterrupted run would have delivered next.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix_scalar(value: int) -> int:
    z = (value + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _splitmix(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # uint64 array arithmetic wraps modulo 2**64, as splitmix64 needs.
    z = values + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, epoch: int, stream: int) -> int:
    """A 64-bit key for one permutation of one epoch (``stream`` 0: shards; b+1: block b)."""
    key = _splitmix_scalar(seed & _MASK)
    key = _splitmix_scalar(key ^ (epoch & _MASK))
    return _splitmix_scalar(key ^ (stream & _MASK))


def permutation(n: int, key: int) -> Ints:
    """A permutation of ``range(n)`` determined by ``key`` alone (see the module docstring)."""
    positions = np.arange(n, dtype=np.uint64) ^ np.uint64(key)
    return np.argsort(_splitmix(positions), kind="stable").astype(np.int64)


#: Samples in a block's shuffle buffer before its first position (it then grows by one
#: per position, up to the configured size): the first batch draws from these.
BUFFER_START = 64


def buffer_shuffle(n: int, buffer: int, key: int) -> Ints:
    """Arrival indices ``0..n-1`` in the order a seeded buffer shuffle hands them out.

    The buffer holds up to ``min(buffer, BUFFER_START + k)`` indices when position
    ``k`` is drawn (fewer at the end, when the arrivals are used up); the draw is
    ``hash(key, k) mod len(buffer)``, and the drawn slot is filled by the buffer's
    last entry. Position ``k`` therefore only uses arrivals ``<= min(buffer,
    BUFFER_START + k) + k`` (see the module docstring).
    """
    if buffer < 1:
        raise ValueError("a shuffle buffer holds at least one sample")
    draws = _splitmix(np.arange(n, dtype=np.uint64) ^ np.uint64(key)).tolist()
    out = np.empty(n, dtype=np.int64)
    held: list[int] = []
    arrived = 0
    for k in range(n):
        want = min(buffer, BUFFER_START + k)
        while len(held) < want and arrived < n:
            held.append(arrived)
            arrived += 1
        slot = draws[k] % len(held)
        out[k] = held[slot]
        last = held.pop()
        if slot < len(held):
            held[slot] = last
    return out


def arrival_order(counts: Sequence[int]) -> Ints:
    """The block's items (index into the concatenated shards) in arrival order.

    Sample ``i`` of the ``j``-th shard of ``c`` samples arrives at ``i / c`` (IEEE
    division, exactly rounded, so the same everywhere), ties broken by ``j``.
    """
    where = np.concatenate([np.arange(c, dtype=np.float64) / c for c in counts])
    shard = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return np.lexsort((shard, where)).astype(np.int64)


def rank_span(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous span ``[start, stop)`` of an epoch of ``total`` positions."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return rank * total // world_size, (rank + 1) * total // world_size


@dataclass(frozen=True)
class EpochOrder:
    """The global order of one epoch over shards with ``counts`` samples each.

    ``buffer``: the block's shuffle buffer in samples (0: a uniform permutation of
    the whole block, the order before buffers; see the module docstring).

    Attributes:
        blocks: the shard indices of each block, in epoch order.
        starts: the global position where each block begins (plus the total at the end).
    """

    counts: tuple[int, ...]
    seed: int
    epoch: int
    shuffle: bool
    window: int
    buffer: int = 0
    blocks: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    starts: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1 or self.seed < 0 or self.epoch < 0 or self.buffer < 0:
            raise ValueError("window must be >= 1; seed, epoch and buffer >= 0")
        n = len(self.counts)
        if self.shuffle:
            shards = permutation(n, stream_key(self.seed, self.epoch, 0)).tolist()
            width = self.window
        else:
            shards, width = list(range(n)), 1
        blocks = tuple(tuple(shards[i : i + width]) for i in range(0, n, width))
        starts = [0]
        for block in blocks:
            starts.append(starts[-1] + sum(self.counts[s] for s in block))
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "starts", tuple(starts))

    @property
    def total(self) -> int:
        """Positions (samples) in the epoch."""
        return self.starts[-1]

    def block_sequence(self, block: int) -> tuple[Ints, Ints]:
        """``(shard, sample)`` arrays of block ``block``, in epoch order."""
        shards = self.blocks[block]
        counts = [self.counts[s] for s in shards]
        shard_of = np.repeat(np.asarray(shards, dtype=np.int64), counts)
        sample_of = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
        if self.shuffle:
            key = stream_key(self.seed, self.epoch, block + 1)
            if self.buffer:
                arrivals = arrival_order(counts)
                perm = arrivals[buffer_shuffle(len(shard_of), self.buffer, key)]
            else:
                perm = permutation(len(shard_of), key)
            shard_of, sample_of = shard_of[perm], sample_of[perm]
        return shard_of, sample_of


@dataclass(frozen=True)
class BlockPlan:
    """What one worker reads of one block: shards in first-use order, then its items."""

    block: int
    shards: tuple[int, ...]
    shard_of: Ints
    sample_of: Ints


@dataclass(frozen=True)
class Partition:
    """Who reads what: this rank of ``world_size``, this worker of ``num_workers``."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    batch_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"invalid partition {self}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")


def rank_length(order: EpochOrder, part: Partition) -> int:
    """Samples the rank of ``part`` reads in one epoch."""
    start, stop = rank_span(order.total, part.rank, part.world_size)
    return stop - start


def worker_plan(order: EpochOrder, part: Partition, consumed: int) -> Iterator[BlockPlan]:
    """The blocks (and items) worker ``part.worker`` yields, resuming at rank position ``consumed``.

    Lazy: each block's permutation is computed when the iteration reaches it.
    """
    span_start, span_stop = rank_span(order.total, part.rank, part.world_size)
    first = span_start + max(0, consumed)
    stride = part.batch_size * part.num_workers
    for block, (begin, end) in enumerate(zip(order.starts, order.starts[1:], strict=False)):
        lo, hi = max(begin, first), min(end, span_stop)
        if lo >= hi:
            continue
        rel = np.arange(lo - first, hi - first, dtype=np.int64)  # positions after the resume point
        mine = rel[(rel % stride) // part.batch_size == part.worker]
        if not len(mine):
            continue
        shard_of, sample_of = order.block_sequence(block)
        picked = mine + (first - order.starts[block])
        shards, samples = shard_of[picked], sample_of[picked]
        _, first_use = np.unique(shards, return_index=True)
        used = tuple(int(shards[i]) for i in sorted(first_use.tolist()))
        yield BlockPlan(block, used, shards, samples)


def upcoming_shards(plans: Sequence[BlockPlan]) -> list[int]:
    """The shards of ``plans`` in first-use order, each once."""
    seen: dict[int, None] = {}
    for plan in plans:
        for shard in plan.shards:
            seen.setdefault(shard, None)
    return list(seen)
