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
