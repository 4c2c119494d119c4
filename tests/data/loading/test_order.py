"""Epoch order and partitioning: pure arithmetic, checked exhaustively on small cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mouthguard.data.loading.order import (
    BUFFER_START,
    EpochOrder,
    Partition,
    arrival_order,
    buffer_shuffle,
    permutation,
    rank_length,
    rank_span,
    stream_key,
    upcoming_shards,
    worker_plan,
)

COUNTS = (5, 7, 3, 9, 4, 6, 1, 8)

Item = tuple[int, int]


def epoch_sequence(order: EpochOrder) -> list[Item]:
    return [
        item
        for block in range(len(order.blocks))
        for item in zip(*(a.tolist() for a in order.block_sequence(block)), strict=True)
    ]


def worker_items(order: EpochOrder, part: Partition, consumed: int = 0) -> list[Item]:
    return [
        item
        for plan in worker_plan(order, part, consumed)
        for item in zip(plan.shard_of.tolist(), plan.sample_of.tolist(), strict=True)
    ]


def delivered(
    order: EpochOrder, rank: int, world: int, workers: int, batch: int, consumed: int = 0
) -> list[Item]:
    """What a DataLoader hands out: whole batches from its workers, round-robin."""
    streams = [
        worker_items(order, Partition(rank, world, w, workers, batch), consumed)
        for w in range(workers)
    ]
    batches = [[s[i : i + batch] for i in range(0, len(s), batch)] for s in streams]
    out: list[Item] = []
    turn = 0
    while any(batches):
        queue = batches[turn % workers]
        if queue:
            out += queue.pop(0)
        turn += 1
    return out


def test_permutation_is_a_permutation_fixed_by_its_key() -> None:
    key = stream_key(3, 1, 0)
    perm = permutation(1000, key)
    assert sorted(perm.tolist()) == list(range(1000))
    assert np.array_equal(perm, permutation(1000, key))
    assert not np.array_equal(perm, permutation(1000, stream_key(3, 2, 0)))
    assert not np.array_equal(perm, permutation(1000, stream_key(4, 1, 0)))


def test_the_order_is_pinned() -> None:
    """The order is part of the format of a saved position: it must never change silently."""
    order = EpochOrder(COUNTS, seed=7, epoch=2, shuffle=True, window=3)
    assert epoch_sequence(order)[:6] == [(1, 5), (7, 5), (6, 0), (1, 1), (7, 4), (7, 2)]
    assert order.blocks == ((6, 7, 1), (0, 3, 4), (5, 2))


def test_the_buffered_order_is_pinned() -> None:
    """The buffer shuffle's order is the format of a version 2 position: pinned too."""
    order = EpochOrder(COUNTS, seed=7, epoch=2, shuffle=True, window=3, buffer=4)
    assert epoch_sequence(order)[:6] == [(7, 1), (1, 0), (6, 0), (1, 1), (7, 0), (7, 2)]
    assert order.blocks == ((6, 7, 1), (0, 3, 4), (5, 2))


def test_arrival_interleaves_shards_in_proportion() -> None:
    # Shards of 4 and 2 samples: 0:0 1:0 | 0:1 | 0:2 1:1 | 0:3 (block indices 0-3, 4-5).
    assert arrival_order([4, 2]).tolist() == [0, 4, 1, 2, 5, 3]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 400), buffer=st.integers(1, 300), key=st.integers(0, 2**64 - 1))
def test_a_buffer_shuffle_draws_only_from_what_has_arrived(n: int, buffer: int, key: int) -> None:
    out = buffer_shuffle(n, buffer, key).tolist()
    assert sorted(out) == list(range(n))
    for k, arrival in enumerate(out):
        assert arrival <= min(buffer, BUFFER_START + k) + k


def test_a_full_buffer_mixes_the_whole_block() -> None:
    """With the buffer holding the block, late positions draw from all that is left."""
    out = buffer_shuffle(4000, 4000, stream_key(0, 0, 1))
    assert out[:100].max() < 300  # early positions: the first arrivals only
    assert out[-1000:].min() < 1000 < out[-1000:].max()  # late ones mix early and late


def test_the_first_batch_of_a_buffered_block_needs_only_each_shards_front() -> None:
    counts = (655, 655, 655, 655)  # a 4-shard window of 100 KB samples in 64 MiB shards
    deepest = {}
    for buffer in (4096, 0):
        order = EpochOrder(counts, seed=3, epoch=0, shuffle=True, window=4, buffer=buffer)
        _, samples = order.block_sequence(0)
        deepest[buffer] = int(samples[:128].max())  # the first batch of each of 4 workers
    # Position 127 uses arrivals up to 64 + 127 + 127, a quarter of them per shard:
    # the first 80 of 655 samples (about 8 MiB of 64). A uniform permutation: all.
    assert deepest[4096] <= (BUFFER_START + 2 * 127) // 4 + 1
    assert deepest[0] > 600


def test_buffer_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="buffer"):
        EpochOrder(COUNTS, 0, 0, True, 3, buffer=-1)
    with pytest.raises(ValueError, match="buffer"):
        buffer_shuffle(3, 0, 1)


@pytest.mark.parametrize("buffer", [0, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_once_per_epoch(shuffle: bool, buffer: int) -> None:
    order = EpochOrder(COUNTS, seed=1, epoch=0, shuffle=shuffle, window=3, buffer=buffer)
    seq = epoch_sequence(order)
    assert sorted(seq) == sorted((s, i) for s, c in enumerate(COUNTS) for i in range(c))
    assert order.total == sum(COUNTS)


def test_without_shuffle_the_order_is_the_manifest_order() -> None:
    order = EpochOrder(COUNTS, seed=1, epoch=5, shuffle=False, window=3)
    assert epoch_sequence(order) == [(s, i) for s, c in enumerate(COUNTS) for i in range(c)]


def test_epochs_differ_and_mix_within_blocks() -> None:
    first = epoch_sequence(EpochOrder(COUNTS, 0, 0, True, 3))
    second = epoch_sequence(EpochOrder(COUNTS, 0, 1, True, 3))
    assert first != second
    order = EpochOrder(COUNTS, 0, 0, True, 3)
    block = [s for s, _ in epoch_sequence(order)[: order.starts[1]]]
    assert len(set(block)) == len(order.blocks[0])  # samples of the window's shards interleave
    assert block != sorted(block)


def test_rank_spans_tile_the_epoch_and_differ_by_at_most_one() -> None:
    for total, world in itertools.product([0, 1, 7, 10, 53], [1, 2, 3, 8]):
        spans = [rank_span(total, r, world) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        sizes = [b - a for a, b in spans]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 9), min_size=1, max_size=7),
    world=st.integers(1, 3),
    workers=st.integers(1, 4),
    batch=st.integers(1, 5),
    window=st.integers(1, 3),
    shuffle=st.booleans(),
    buffer=st.integers(0, 6),
)
def test_exactly_once_and_the_same_for_any_worker_count(
    counts: list[int], world: int, workers: int, batch: int, window: int, shuffle: bool, buffer: int
) -> None:
    order = EpochOrder(tuple(counts), 11, 3, shuffle, window, buffer)
    everything: list[Item] = []
    for rank in range(world):
        alone = delivered(order, rank, world, 1, batch)
        assert delivered(order, rank, world, workers, batch) == alone
        assert len(alone) == rank_length(order, Partition(rank, world))
        everything += alone
    assert everything == epoch_sequence(order)  # ranks' spans, in rank order: the epoch


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    workers=st.integers(1, 3),
    batch=st.integers(1, 4),
    cut=st.integers(0, 60),
    buffer=st.integers(0, 6),
)
def test_resuming_at_any_point_continues_the_same_sequence(
    counts: list[int], workers: int, batch: int, cut: int, buffer: int
) -> None:
    order = EpochOrder(tuple(counts), 5, 1, True, 2, buffer)
    whole = delivered(order, 0, 1, workers, batch)
    cut = min(cut, len(whole))
    assert whole[:cut] + delivered(order, 0, 1, workers, batch, consumed=cut) == whole


def test_plans_name_their_shards_in_first_use_order() -> None:
    order = EpochOrder(COUNTS, 2, 0, True, 3)
    plans = list(worker_plan(order, Partition(0, 1, 0, 2, 2), 0))
    for plan in plans:
        firsts = list(dict.fromkeys(plan.shard_of.tolist()))
        assert list(plan.shards) == firsts
    assert upcoming_shards(plans) == list(dict.fromkeys(s for p in plans for s in p.shards))


def test_partition_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="invalid partition"):
        Partition(rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        Partition(batch_size=0)
