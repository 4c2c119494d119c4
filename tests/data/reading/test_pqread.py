"""Parquet datasets, streamed by row group: every row once, exact resume, damage never skipped.

The files are written by pyarrow (several files, several row groups each, mixed
column types) and adopted in place; the loader is the same ``StreamingDataset``
/ ``StreamingDataLoader`` as for shards, with a row group as its unit.
"""

from __future__ import annotations

import io
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import StreamingDataLoader, StreamingDataset, index_dataset, open_dataset
from mouthguard.data.reading.pqread import _RangeFile
from mouthguard.errors import DatasetChangedError, DatasetError, ShardDamagedError

from ..adopted import parquet_files, parquet_rows
from ..helpers import flip_byte, truncate

BATCH = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], int]:
    root = tmp_path_factory.mktemp("pq") / "text"
    paths, rows = parquet_files(root)
    index_dataset(root)
    return root, paths, rows


@pytest.fixture
def text(built: tuple[Path, list[Path], int], tmp_path: Path) -> tuple[Path, list[Path], int]:
    """A private copy, for tests that damage it."""
    root, paths, rows = built
    shutil.copytree(root, tmp_path / "text")
    return tmp_path / "text", [tmp_path / "text" / p.relative_to(root) for p in paths], rows


def make(root: Path, **kwargs: Any) -> StreamingDataset:
    options: dict[str, Any] = {"shuffle": True, "seed": 3, "batch_size": BATCH, "shuffle_window": 2}
    return StreamingDataset(root, **{**options, **kwargs})


def ids(batch: list[dict[str, Any]]) -> list[int]:
    """A collate function: the ids of a batch of rows (rows hold None and ragged lists)."""
    return [row["id"] for row in batch]


@pytest.mark.parametrize("cached", [False, True])
def test_every_row_with_its_values_in_file_order(
    built: tuple[Path, list[Path], int], tmp_path: Path, cached: bool
) -> None:
    root, paths, rows = built
    cache = tmp_path / "cache" if cached else None
    got = list(StreamingDataset(root, cache_dir=cache))
    assert got == parquet_rows(paths)  # strings, lists, structs, nulls: as pyarrow reads them
    assert len(got) == rows


def test_shuffled_epochs_are_permutations_fixed_by_seed_and_epoch(
    built: tuple[Path, list[Path], int],
) -> None:
    root, _, rows = built
    dataset = make(root)
    first, second = [r["id"] for r in dataset], [r["id"] for r in dataset]
    assert sorted(first) == sorted(second) == list(range(rows))
    assert first != second and dataset.epoch == 2
    assert [r["id"] for r in make(root)] == first


def test_a_decode_hook(built: tuple[Path, list[Path], int]) -> None:
    root, _, _ = built
    decoded = list(StreamingDataset(root, decode=lambda row: (row["id"], row["text"])))
    assert decoded[:2] == [(0, None), (1, "doc 1 é")]


@pytest.mark.parametrize("cut", [1, 59, 60, 200, 700])
def test_resume_in_process_is_exact(built: tuple[Path, list[Path], int], cut: int) -> None:
    root, _, rows = built
    reference = [r["id"] for r in make(root)]
    first = make(root)
    head = []
    for row in first:
        head.append(row["id"])
        if len(head) == cut:
            break
    state = first.state_dict()
    resumed = make(root, seed=99)  # the seed comes back from the state
    resumed.load_state_dict(state)
    tail = [r["id"] for r in resumed]
    assert head + tail == reference and len(reference) == rows


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_workers_deliver_the_same_sequence_and_resume_exactly(
    built: tuple[Path, list[Path], int], tmp_path: Path
) -> None:
    root, _, rows = built
    reference = [r["id"] for r in make(root)]
    for workers in (0, 2):
        loader = StreamingDataLoader(make(root), num_workers=workers, collate_fn=ids)
        assert [i for batch in loader for i in batch] == reference, f"{workers} workers"
    loader = StreamingDataLoader(
        make(root, cache_dir=tmp_path / "cache"), num_workers=2, collate_fn=ids
    )
    head: list[int] = []
    for number, batch in enumerate(loader):
        head += batch
        if number == 6:
            break
    state = loader.state_dict()
    resumed = StreamingDataLoader(
        make(root, cache_dir=tmp_path / "cache"), num_workers=2, collate_fn=ids
    )
    resumed.load_state_dict(state)
    tail = [i for batch in resumed for i in batch]
    assert head + tail == reference
    assert Counter(head + tail) == Counter(range(rows))  # every row exactly once


def test_the_position_is_bound_to_the_files(text: tuple[Path, list[Path], int]) -> None:
    root, paths, _ = text
    state = make(root).state_dict()
    shutil.rmtree(root / "mouthguard-index")
    paths[0].unlink()  # a dataset of other rows now
    index_dataset(root)
    with pytest.raises(DatasetChangedError, match="sha256:"):
        make(root).load_state_dict(state)


def _row_group_of(root: Path, file: int, group: int) -> tuple[int, int]:
    record = open_dataset(root).files[file]
    return record.row_groups[group].offset, record.row_groups[group].end


def _until_error(dataset: StreamingDataset) -> tuple[list[int], ShardDamagedError]:
    seen: list[int] = []

    def consume() -> None:
        seen.extend(row["id"] for row in dataset)

    with pytest.raises(ShardDamagedError) as caught:
        consume()
    return seen, caught.value


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_flipped_byte_in_a_row_group_stops_before_any_of_its_rows(
    text: tuple[Path, list[Path], int], tmp_path: Path, cached: bool, prefetch: int
) -> None:
    root, paths, _ = text
    start, end = _row_group_of(root, 1, 2)
    flip_byte(paths[1], (start + end) // 2)
    dataset = StreamingDataset(
        root, cache_dir=tmp_path / "cache" if cached else None, prefetch=prefetch
    )
    seen, error = _until_error(dataset)
    assert error.shard == "data/train-00001-of-00003.parquet"
    assert "row group 2" in str(error) and "sha256" in str(error)
    assert seen == list(range(230 + 120))  # file 0, then row groups 0 and 1 of file 1


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: flip_byte(p, -20), "footer"),
        (lambda p: truncate(p, p.stat().st_size - 1), "truncated"),
        (lambda p: p.unlink(), "missing"),
    ],
    ids=["footer", "truncated", "missing"],
)
def test_a_damaged_file_is_refused_naming_it(
    text: tuple[Path, list[Path], int], damage: Any, why: str
) -> None:
    root, paths, _ = text
    damage(paths[2])
    seen, error = _until_error(StreamingDataset(root))
    assert error.shard == "data/train-00002-of-00003.parquet" and why in str(error)
    assert seen == list(range(230 + 247))  # every row of the files before it


def test_an_added_file_is_not_read(text: tuple[Path, list[Path], int]) -> None:
    root, _, rows = text
    parquet_files(root / "more", files=1, start=10**6)
    shutil.move(
        root / "more" / "data" / "train-00000-of-00001.parquet", root / "data" / "z.parquet"
    )
    assert sorted(r["id"] for r in StreamingDataset(root)) == list(range(rows))


def test_the_decoder_reads_only_the_verified_range() -> None:
    source = _RangeFile(100, 40, bytes(range(20)), "f row group 0")
    source.seek(45)
    assert source.read(5) == bytes(range(5, 10))
    source.seek(55)
    with pytest.raises(DatasetError, match="outside its verified range"):
        source.read(10)  # bytes 55 to 65: past the range's end at 60
    source.seek(-8, io.SEEK_END)
    with pytest.raises(DatasetError, match="outside"):
        source.read(8)  # the file's tail: pyarrow is handed the footer, never reads it
