"""RangeHasher: one pass, the whole file's sha256 and each range's, however the chunks fall."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mouthguard.data.formats.rangehash import RangeHasher

DATA = bytes(range(256)) * 8


@given(
    cuts=st.lists(st.integers(1, len(DATA) - 1), unique=True, max_size=12),
    bounds=st.lists(st.integers(0, len(DATA)), unique=True, min_size=2, max_size=10),
)
def test_every_digest_whatever_the_chunks(cuts: list[int], bounds: list[int]) -> None:
    points = sorted(bounds)
    ranges = [(a, b - a) for a, b in zip(points[::2], points[1::2], strict=False) if b > a]
    hasher = RangeHasher(ranges)
    edges = [0, *sorted(cuts), len(DATA)]
    for start, end in itertools.pairwise(edges):
        hasher.feed(start, DATA[start:end])
    assert hasher.whole.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert hasher.digests() == [hashlib.sha256(DATA[o : o + n]).hexdigest() for o, n in ranges]


def test_chunks_must_come_in_order() -> None:
    hasher = RangeHasher([])
    hasher.feed(0, b"abc")
    with pytest.raises(ValueError, match="expected 3"):
        hasher.feed(4, b"x")
