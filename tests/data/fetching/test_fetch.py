"""How the default range reads in flight are split among a loader's workers."""

from __future__ import annotations

import pytest

from mouthguard.data.fetching.fetch import MIN_RANGE_PARALLEL, NODE_RANGE_REQUESTS, split_parallel


@pytest.mark.parametrize(
    ("workers", "each"), [(0, 8), (1, 8), (2, 4), (3, 2), (4, 2), (8, 2), (64, 2)]
)
def test_eight_per_node_are_split_with_at_least_two_each(workers: int, each: int) -> None:
    assert split_parallel(workers) == each


def test_each_worker_gets_the_largest_share_of_eight_and_at_least_two() -> None:
    for workers in range(1, 33):
        each = split_parallel(workers)
        assert each >= MIN_RANGE_PARALLEL
        assert each * workers <= max(NODE_RANGE_REQUESTS, MIN_RANGE_PARALLEL * workers)
        assert (each + 1) * workers > NODE_RANGE_REQUESTS or each == NODE_RANGE_REQUESTS
