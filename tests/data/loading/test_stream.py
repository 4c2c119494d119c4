"""StreamingDataset in one process: verified samples, exact resume, damage never skipped."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import StreamingDataset, open_dataset
from mouthguard.data.dataset import Dataset
from mouthguard.errors import (
    DatasetChangedError,
    DataStateError,
    ManifestError,
    ShardDamagedError,
    SignatureError,
)

from ..helpers import expected, flip_byte, index_path, sample, shard_path, truncate, write_dataset

N = 40


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    write_dataset(tmp_path, n=N)
    return tmp_path / "ds"


def keys(dataset: Any) -> list[str]:
    return [s["__key__"] for s in dataset]


@pytest.mark.parametrize("cached", [False, True])
def test_every_sample_with_its_bytes(ds: Path, tmp_path: Path, cached: bool) -> None:
    cache = tmp_path / "cache" if cached else None
    got = {
        s["__key__"]: {k: v for k, v in s.items() if k != "__key__"}
        for s in StreamingDataset(ds, cache_dir=cache)
    }
    assert got == expected(N)
    in_order = keys(StreamingDataset(ds, cache_dir=cache))
    assert in_order == [f"s{i:05d}" for i in range(N)]  # no shuffle: manifest order


def test_shuffle_is_a_permutation_fixed_by_seed_and_epoch(ds: Path) -> None:
    first = StreamingDataset(ds, shuffle=True, seed=3)
    epoch0, epoch1 = keys(first), keys(first)  # an epoch ends: the next one begins
    assert sorted(epoch0) == sorted(epoch1) == sorted(expected(N))
    assert epoch0 != epoch1 and first.epoch == 2
    again = StreamingDataset(ds, shuffle=True, seed=3)
    assert keys(again) == epoch0
    assert keys(StreamingDataset(ds, shuffle=True, seed=4)) != epoch0


def test_decode(ds: Path) -> None:
    decoded = list(StreamingDataset(ds, decode=lambda s: s["txt"].decode()))
    assert decoded[:2] == ["sample 0", "sample 1"]


def _until_error(dataset: StreamingDataset) -> tuple[list[str], ShardDamagedError]:
    seen: list[str] = []

    def consume() -> None:
        seen.extend(item["__key__"] for item in dataset)

    with pytest.raises(ShardDamagedError) as caught:
        consume()
    return seen, caught.value


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize(
    "damage",
    [
        lambda ds: flip_byte(shard_path(ds, 2), 3000),
        lambda ds: flip_byte(shard_path(ds, 2), -1),
        lambda ds: truncate(shard_path(ds, 2), 512),
        lambda ds: shard_path(ds, 2).unlink(),
        lambda ds: flip_byte(index_path(ds, 2), 30),
    ],
    ids=["flipped", "flipped-padding", "truncated", "missing", "index"],
)
def test_damage_stops_before_any_sample_of_the_shard(
    ds: Path, tmp_path: Path, cached: bool, prefetch: int, damage: Any
) -> None:
    manifest = open_dataset(ds).manifest
    before = sum(s.samples for s in manifest.shards[:2])
    damage(ds)
    dataset = StreamingDataset(
        ds, cache_dir=tmp_path / "cache" if cached else None, prefetch=prefetch
    )
    seen, error = _until_error(dataset)
    assert "shard-000002.tar" in str(error) and error.shard == "shard-000002.tar"
    assert seen == [f"s{i:05d}" for i in range(before)]  # nothing of shard 2, nothing skipped


def test_a_tampered_manifest_refuses_the_dataset(ds: Path) -> None:
    flip_byte(ds / "dataset.json", 50)
    with pytest.raises(ManifestError):
        StreamingDataset(ds)


def test_an_unsigned_manifest_is_refused_when_a_key_is_set(
    ds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOUTHGUARD_MANIFEST_KEY", "hex:" + bytes(range(32)).hex())
    with pytest.raises(SignatureError):
        StreamingDataset(ds)


def test_an_altered_cache_entry_is_downloaded_again(ds: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dataset = StreamingDataset(ds, cache_dir=cache)
    assert keys(dataset) == sorted(expected(N))
    for entry in (cache / "blobs").iterdir():
        if not entry.name.endswith(".ok"):
            flip_byte(entry, 100)  # every cached shard and index altered in place
    got = {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in dataset}
    assert got == expected(N)


def test_a_shard_changed_between_epochs_in_place_is_caught(ds: Path) -> None:
    dataset = StreamingDataset(ds)
    assert len(keys(dataset)) == N  # every shard hashed once; stamps kept in this process
    flip_byte(shard_path(ds, 1), 2000)
    with pytest.raises(ShardDamagedError, match=r"shard-000001\.tar"):
        keys(dataset)


# --- position and resume ----------------------------------------------------------


def _run(dataset: StreamingDataset, count: int) -> list[str]:
    out: list[str] = []
    if count <= 0:
        return out
    for item in dataset:
        out.append(item["__key__"])
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("cut", [0, 1, 17, N - 1, N, N + 5])
def test_resume_in_process_is_exact(ds: Path, cut: int) -> None:
    reference = StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2)
    whole = keys(reference) + keys(reference)  # two epochs
    first = StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2)
    head = _run(first, cut) if cut <= N else keys(first) + _run(first, cut - N)
    state = first.state_dict()
    resumed = StreamingDataset(ds, shuffle=True, seed=0, shuffle_window=2)  # seed comes back
    resumed.load_state_dict(state)
    tail: list[str] = []
    while len(head) + len(tail) < 2 * N:
        tail += keys(resumed)
    assert head + tail == whole


def test_a_version_1_position_resumes_in_its_order_with_a_buffer_of_0(ds: Path) -> None:
    """A position saved before the shuffle buffer named the uniform block permutation:
    read as ``shuffle_buffer=0``, it resumes exactly there, and is refused elsewhere."""
    old_order = StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2, shuffle_buffer=0)
    whole = keys(old_order)
    first = StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2, shuffle_buffer=0)
    head = _run(first, 17)
    state = first.state_dict()
    assert state.pop("shuffle_buffer") == 0
    state["version"] = 1  # what a loader before the buffer wrote
    with pytest.raises(DataStateError, match="shuffle_buffer=0"):
        StreamingDataset(ds, shuffle=True, shuffle_window=2).load_state_dict(state)
    resumed = StreamingDataset(ds, shuffle=True, shuffle_window=2, shuffle_buffer=0)
    resumed.load_state_dict(state)
    assert head + keys(resumed) == whole
    with pytest.raises(DataStateError, match="exactly the keys"):  # no buffer in version 1
        resumed.load_state_dict({**state, "shuffle_buffer": 5})


def test_the_buffered_order_differs_from_the_uniform_one(ds: Path) -> None:
    buffered = keys(StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2))
    uniform = keys(StreamingDataset(ds, shuffle=True, seed=9, shuffle_window=2, shuffle_buffer=0))
    assert buffered != uniform and sorted(buffered) == sorted(uniform)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        StreamingDataset(ds, shuffle_buffer=-1)


def test_set_epoch_keeps_a_resumed_position(ds: Path) -> None:
    dataset = StreamingDataset(ds)
    _run(dataset, 10)
    assert (dataset.epoch, dataset.consumed) == (0, 10)
    dataset.set_epoch(0)
    assert dataset.consumed == 10
    dataset.set_epoch(3)
    assert (dataset.epoch, dataset.consumed) == (3, 0)


def test_a_changed_dataset_is_refused_naming_both_fingerprints(tmp_path: Path) -> None:
    write_dataset(tmp_path / "v1", n=N)
    write_dataset(tmp_path / "v2", samples=[sample(i) for i in range(N + 1)])
    old = StreamingDataset(tmp_path / "v1" / "ds")
    _run(old, 7)
    state = old.state_dict()
    new = StreamingDataset(tmp_path / "v2" / "ds")
    with pytest.raises(DatasetChangedError) as caught:
        new.load_state_dict(state)
    assert old.fingerprint in str(caught.value) and new.fingerprint in str(caught.value)
    assert "force=True" in str(caught.value)
    new.load_state_dict(state, force=True)
    assert (new.epoch, new.consumed) == (0, 7)
    assert new.state_dict()["fingerprint"] == new.fingerprint


def test_the_same_content_elsewhere_resumes(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", n=N)
    write_dataset(tmp_path / "b", "copy", n=N)  # another name and place, the same shards
    first = StreamingDataset(tmp_path / "a" / "ds")
    _run(first, 5)
    other = StreamingDataset(tmp_path / "b" / "copy")
    other.load_state_dict(first.state_dict())
    assert keys(other)[0] == "s00005"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"shuffle": True}, "shuffle"),
        ({"shuffle_buffer": 7}, "shuffle_buffer"),
        ({"version": 3}, "not a"),
        ({"world_size": 2}, "world_size"),
        ({"consumed": N + 1}, "past the end"),
        ({"epoch": -1}, "epoch"),
        ({"format": "other"}, "not a"),
        ({"extra": 1}, "exactly the keys"),
    ],
)
def test_a_position_that_means_nothing_here_is_refused(
    ds: Path, change: dict[str, Any], why: str
) -> None:
    state = {**StreamingDataset(ds).state_dict(), **change}
    with pytest.raises(DataStateError, match=why):
        StreamingDataset(ds).load_state_dict(state)


def test_a_malformed_position_is_refused(ds: Path) -> None:
    with pytest.raises(DataStateError, match="mapping"):
        StreamingDataset(ds).load_state_dict([1, 2])


# --- checkpoint bursts ------------------------------------------------------------


class StuckBurst:
    """A burst that never ends on its own: prefetch must wait, the consumer must not."""

    def __init__(self) -> None:
        self.waits = 0
        self.release = threading.Event()

    @property
    def busy(self) -> bool:
        return not self.release.is_set()

    def wait(self, timeout: float) -> float:
        self.waits += 1
        self.release.wait(timeout)
        return 0.0


def test_prefetch_yields_to_a_burst_but_the_consumer_never_waits(ds: Path, tmp_path: Path) -> None:
    burst = StuckBurst()
    dataset = StreamingDataset(ds, cache_dir=tmp_path / "cache", prefetch=2, burst=burst)
    try:
        got = keys(dataset)  # completes although the burst never ends
    finally:
        burst.release.set()
    assert got == sorted(expected(N))
    assert burst.waits >= 1


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the shards whose index is read, in the order they are read."""
    names: list[str] = []
    real = Dataset.read_index

    def counted(self: Dataset, shard: Any) -> Any:
        names.append(shard.name)
        return real(self, shard)

    monkeypatch.setattr(Dataset, "read_index", counted)
    return names


def test_indexes_are_parsed_once_per_dataset_object_and_again_by_a_new_one(
    ds: Path, parses: list[str]
) -> None:
    shards = len(open_dataset(ds).manifest.shards)
    first = StreamingDataset(ds, shuffle=False)
    for _ in range(2):
        assert [s["__key__"] for s in first] == sorted(expected())
    assert len(parses) == shards  # the second pass parsed nothing
    flip_byte(index_path(ds, 2), 30)  # damaged after the first object read it
    with pytest.raises(ShardDamagedError, match="shard-000002"):
        list(StreamingDataset(ds, shuffle=False))  # a new object reads and checks it again


@pytest.mark.parametrize("batch", [1, 3])
def test_the_next_blocks_indexes_wait_for_the_first_batch(
    ds: Path, parses: list[str], batch: int
) -> None:
    """Only the first block's index is read before its first batch; the rest follow, each once."""
    manifest = open_dataset(ds).manifest
    assert manifest.shards[0].samples > batch  # the first batch lies in the first block
    shards = [s.name for s in manifest.shards]
    samples = iter(StreamingDataset(ds, shuffle=False, prefetch=2, batch_size=batch))
    first = [next(samples)["__key__"] for _ in range(batch)]
    assert first == [f"s{i:05d}" for i in range(batch)]
    assert parses == [shards[0]]  # the next block is planned when the next sample is asked for
    rest = [s["__key__"] for s in samples]
    assert rest == [f"s{i:05d}" for i in range(batch, N)]
    assert sorted(parses) == shards


def test_the_position_read_during_a_pass_counts_every_sample_handed_out(ds: Path) -> None:
    """Reading the position mid-pass changes nothing: the count goes on from where it was."""
    dataset = StreamingDataset(ds, shuffle=True, seed=3)
    samples = iter(dataset)
    for handed in range(1, 6):
        next(samples)
        assert dataset.consumed == handed
        assert dataset.state_dict()["consumed"] == handed  # read twice: still the same
    dataset.set_epoch(4)  # another epoch set mid-pass: the pass's count still applies
    next(samples)
    assert (dataset.epoch, dataset.consumed) == (4, 6)
    assert len(list(samples)) == N - 6
    assert (dataset.epoch, dataset.consumed) == (1, 0)  # the pass that ran was epoch 0's
