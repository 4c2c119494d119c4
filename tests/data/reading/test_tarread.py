"""TarUnits: indexes of announced shards are read ahead, bounded; their damage still surfaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from mouthguard.data import open_dataset
from mouthguard.data.fetching.fetch import ReadSettings, ShardSource
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.data.reading import tarread
from mouthguard.data.reading.tarread import TarUnits
from mouthguard.errors import ShardDamagedError

from ..helpers import flip_byte, index_path, write_dataset


def _units(tmp_path: Path) -> TarUnits:
    dataset = open_dataset(tmp_path / "ds")
    place = VerifiedFiles(tmp_path / "verified", "stat")
    return TarUnits(ShardSource(dataset, place, ReadSettings()))


def test_announced_indexes_are_read_ahead_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_dataset(tmp_path, n=60)
    shards = len(manifest.shards)
    assert shards > 3
    monkeypatch.setattr(tarread, "_MAX_PENDING", 3)
    units = _units(tmp_path)
    try:
        units.warm(range(shards))
        assert len(units._pending) == 3  # the oldest announcements forgotten
        for number in range(shards):  # forgotten or not, every index is served, and right
            index = units._index(number)
            assert len(index.samples) == manifest.shards[number].samples
        assert not units._pending
    finally:
        units.close()


def test_a_damaged_index_read_ahead_is_raised_where_it_is_asked_for(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=40)
    flip_byte(index_path(tmp_path / "ds", 1), 30)
    units = _units(tmp_path)
    try:
        units.warm([0, 1])
        assert units._index(0).shard == "shard-000000.tar"
        with pytest.raises(ShardDamagedError, match="shard-000001"):
            units._index(1)
    finally:
        units.close()


@pytest.mark.parametrize("large", [False, True], ids=["span read", "members read directly"])
def test_samples_come_whole_and_each_header_must_name_its_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: bool
) -> None:
    """Below DIRECT_READ a sample is one read of its span, from it each member read alone."""
    size = tarread.DIRECT_READ if large else 1000  # the large ones: "bin" direct, "txt" not
    samples = [
        {"__key__": f"k{i}", "txt": f"text {i}", "bin": bytes([i + 1]) * (size + i)}
        for i in range(4)
    ]
    write_dataset(tmp_path, samples=samples, shard_size=64 * 1024 * 1024)
    units = _units(tmp_path)
    try:
        opened = units.open_unit(0, must=True)
        assert opened is not None
        index = units._index(0)
        assert (min(e.length for e in index.samples) >= tarread.DIRECT_READ) is large
        got = list(units.read({0: opened}, [0, 0, 0, 0], [3, 1, 0, 2]))
        assert got == [
            {"__key__": s["__key__"], "txt": s["txt"].encode(), "bin": s["bin"]}
            for s in (samples[3], samples[1], samples[0], samples[2])
        ]
        # An index that lists sample 1's bytes under sample 0's key: caught at the header.
        forged = index._replace(samples=(index.samples[1]._replace(key="k0"), *index.samples[1:]))
        monkeypatch.setattr(units, "_index", lambda unit: forged)
        with pytest.raises(ShardDamagedError, match=r"shard-000000\.tar: tar header names b'k1\."):
            list(units.read({0: opened}, [0], [0]))
        opened.close()
    finally:
        units.close()
