"""The samples every format stores: deterministic keys and incompressible payloads."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

SEED = 0


def sample_count(total: int, sample_size: int) -> int:
    """Samples of ``sample_size`` bytes in a dataset of about ``total`` bytes (at least 1)."""
    return max(1, total // sample_size)


def key(i: int) -> str:
    """Sample ``i``'s key: sorts in sample order, valid in every format."""
    return f"s{i:08d}"


def payload(i: int, size: int) -> bytes:
    """Sample ``i``'s payload: ``size`` random bytes from a generator seeded by ``i``."""
    return np.random.Generator(np.random.PCG64([SEED, i])).bytes(size)


def samples(count: int, size: int) -> Iterator[tuple[str, bytes]]:
    """Every sample as (key, payload), in key order."""
    for i in range(count):
        yield key(i), payload(i, size)
