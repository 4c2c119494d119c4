"""VerifiedFiles: one hash per in-place shard across processes and epochs, until it changes."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import StreamingDataLoader, StreamingDataset
from mouthguard.data.fetching import inplace, verified
from mouthguard.data.fetching.scratch import default_verified_dir
from mouthguard.data.fetching.verified import VerifiedFiles
from mouthguard.data.formats.part import Part
from mouthguard.errors import ShardDamagedError

from ..helpers import expected, flip_byte, shard_path, write_dataset

HashRange = Callable[[int, int, int], str]


def counting_hashes(monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    """Log every hash, from this process and any it forks, to ``log``.

    A whole file hashed at once, or (a shard with a range table, read by a dataset)
    its ranges one by one: the shards these tests write fit in one range.
    """
    for module in (verified, inplace):
        real = module.hash_range

        def logged(fd: int, start: int, size: int, real: HashRange = real) -> str:
            with log.open("a") as f:
                f.write(f"{os.getpid()} {start} {size}\n")
            return real(fd, start, size)

        monkeypatch.setattr(module, "hash_range", logged)


def hashes(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 10_000)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def check(files: VerifiedFiles, path: Path, sha256: str, offset: int = 0) -> None:
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        part = Part("blob", "shard", size, offset, size - offset, sha256)
        files.check(fd, str(path), part)
    finally:
        os.close(fd)


def test_a_file_hashed_by_one_process_is_trusted_by_the_others(
    tmp_path: Path, blob: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)
    path, sha = blob
    check(VerifiedFiles(tmp_path / "record", "stat"), path, sha)
    check(VerifiedFiles(tmp_path / "record", "stat"), path, sha)  # another holder of the record
    assert hashes(log) == 1
    check(VerifiedFiles(tmp_path / "other", "stat"), path, sha)  # another record knows nothing
    assert hashes(log) == 2
    tail = hashlib.sha256(path.read_bytes()[100:]).hexdigest()
    check(VerifiedFiles(tmp_path / "record", "stat"), path, tail, offset=100)  # another part
    assert hashes(log) == 3


def test_a_changed_file_is_hashed_again_and_damage_is_caught(
    tmp_path: Path, blob: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)
    path, sha = blob
    files = VerifiedFiles(tmp_path / "record", "stat")
    check(files, path, sha)
    flip_byte(path, 5)  # same size, new ctime
    with pytest.raises(ShardDamagedError, match="blob"):
        check(files, path, sha)
    assert hashes(log) == 2
    assert not list((tmp_path / "record").glob("*.ok"))  # the damaged file's record is gone
    flip_byte(path, 5)  # repaired: hashed again, and trusted again
    check(files, path, sha)
    check(files, path, sha)
    assert hashes(log) == 3


def test_always_hashes_on_every_open(
    tmp_path: Path, blob: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)
    path, sha = blob
    files = VerifiedFiles(tmp_path / "record", "always")
    for _ in range(3):
        check(files, path, sha)
    assert hashes(log) == 3
    with pytest.raises(ValueError, match="verify_cache"):
        VerifiedFiles(tmp_path / "record", "never")  # type: ignore[arg-type]


def make(ds: Path, **kwargs: Any) -> StreamingDataset:
    return StreamingDataset(ds, shuffle=True, seed=1, batch_size=4, **kwargs)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_workers_hash_each_shard_once_over_several_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_dataset(tmp_path, n=50)
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)  # forked workers inherit the patch
    loader = StreamingDataLoader(
        make(tmp_path / "ds"), num_workers=3, multiprocessing_context="fork"
    )
    for _ in range(2):
        seen = [key for batch in loader for key in batch["__key__"]]
        assert sorted(seen) == sorted(expected(50))
    # Every worker of both epochs opens every shard; only the first opener hashes it.
    assert hashes(log) == len(manifest.shards) > 3


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_a_shard_altered_between_epochs_is_caught_by_the_workers(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=50)
    loader = StreamingDataLoader(make(tmp_path / "ds"), num_workers=2)
    assert len(list(loader)) > 0
    flip_byte(shard_path(tmp_path / "ds", 2), 700)
    with pytest.raises(ShardDamagedError, match=r"shard-000002\.tar"):
        list(loader)


def test_a_temporary_record_directory_goes_with_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where no private persistent directory can be had, the record is temporary.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("MOUTHGUARD_VERIFIED_DIR", str(shared))
    write_dataset(tmp_path, n=10)
    dataset = make(tmp_path / "ds")
    assert dataset.verified_dir is not None and Path(dataset.verified_dir).is_dir()
    record = Path(dataset.verified_dir)
    assert record != shared
    assert len(list(dataset)) == 10
    del dataset
    assert not record.exists()
    assert make(tmp_path / "ds", cache_dir=tmp_path / "cache").verified_dir is None


def test_a_new_dataset_object_trusts_what_an_earlier_one_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a new training process does: the record outlives the dataset object.
    monkeypatch.setenv("MOUTHGUARD_VERIFIED_DIR", str(tmp_path / "verified"))
    manifest = write_dataset(tmp_path, n=30)
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)
    for _ in range(2):
        dataset = make(tmp_path / "ds")
        assert sorted(s["__key__"] for s in dataset) == sorted(expected(30))
        del dataset
    assert hashes(log) == len(manifest.shards)  # the second object hashed nothing
    assert (tmp_path / "verified").stat().st_mode & 0o077 == 0  # private to the user


def test_a_record_directory_others_can_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert default_verified_dir({"MOUTHGUARD_VERIFIED_DIR": str(shared)}) is None
    mine = tmp_path / "cache"
    found = default_verified_dir({"XDG_CACHE_HOME": str(mine)})
    assert found == str(mine / "mouthguard" / "verified")


def test_a_record_that_cannot_be_written_is_logged_and_the_read_goes_on(
    tmp_path: Path,
    blob: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = tmp_path / "hashes.log"
    counting_hashes(monkeypatch, log)

    def disk_full(record: Path, key: list[int]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(verified, "_write_record", disk_full)
    path, sha = blob
    files = VerifiedFiles(tmp_path / "record", "stat")
    with caplog.at_level(logging.WARNING, logger=verified.__name__):
        check(files, path, sha)  # the bytes matched: no error for the reader
    assert "was not written" in caplog.text
    assert "No space left" in caplog.text
    check(files, path, sha)  # nothing recorded: the next check pays one hash
    assert hashes(log) == 2
    with pytest.raises(ShardDamagedError):  # damage is still refused, record or not
        check(files, path, hashlib.sha256(b"other").hexdigest())
