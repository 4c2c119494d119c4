"""StreamingDataLoader with real DataLoader workers: same sequence for any worker count,
exact resume, a shared bounded cache, damage surfacing in the main process."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import StreamingDataLoader, StreamingDataset
from mouthguard.data.loading.loader import main_module_by_name
from mouthguard.errors import ShardDamagedError
from mouthguard.tiers.local import LocalTier

from ..helpers import dir_bytes, expected, flip_byte, shard_path, write_dataset

N = 53  # not a multiple of the batch size: the rank's last batch is partial
BATCH = 4


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loader")
    write_dataset(root, n=N)
    return root / "ds"


def make(ds: Path, **kwargs: Any) -> StreamingDataset:
    options: dict[str, Any] = {"shuffle": True, "seed": 5, "batch_size": BATCH}
    return StreamingDataset(ds, **{**options, **kwargs})


def batches(loader: StreamingDataLoader, count: int | None = None) -> list[list[str]]:
    out: list[list[str]] = []
    for batch in loader:
        out.append(list(batch["__key__"]))
        if count is not None and len(out) == count:
            break
    return out


def flat(items: list[list[str]]) -> list[str]:
    return [key for batch in items for key in batch]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_the_sequence_is_the_same_for_any_number_of_workers(ds: Path) -> None:
    reference = [s["__key__"] for s in make(ds)]  # in-process iteration of the dataset
    assert sorted(reference) == sorted(expected(N))
    for workers in (0, 1, 2, 3):
        got = batches(StreamingDataLoader(make(ds), num_workers=workers))
        assert flat(got) == reference, f"{workers} workers"
        assert [len(b) for b in got] == [BATCH] * (N // BATCH) + [N % BATCH]


@pytest.mark.parametrize("cut", [1, 6, 13, 14])
def test_resume_with_workers_is_exact(ds: Path, cut: int) -> None:
    loader = StreamingDataLoader(make(ds), num_workers=2)
    whole = flat(batches(loader)) + flat(batches(loader))  # two epochs
    first = StreamingDataLoader(make(ds), num_workers=2)
    head = flat(batches(first, cut))
    state = first.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, min(cut * BATCH, N))
    resumed = StreamingDataLoader(make(ds, seed=0), num_workers=2)
    resumed.load_state_dict(state)
    tail: list[str] = []
    for epoch in range(resumed.epoch, 2):
        resumed.set_epoch(epoch)  # the usual loop: keeps the resumed position
        tail += flat(batches(resumed))
    assert head + tail == whole


@pytest.mark.parametrize("cut", [3, 14])
def test_persistent_workers_follow_the_position_and_resume_exactly(ds: Path, cut: int) -> None:
    """Workers kept across epochs read each iteration's start from the loader: the same
    sequence as new workers every epoch, through an interrupted epoch and a resume.

    (Persistent workers used to be refused; they now read the start position the
    loader keeps in shared memory, so the test that pinned the refusal became this.)
    """
    reference = StreamingDataLoader(make(ds), num_workers=2)
    whole = [flat(batches(reference)) for _ in range(3)]
    kept = StreamingDataLoader(make(ds), num_workers=2, persistent_workers=True)
    assert flat(batches(kept)) == whole[0]
    head = flat(batches(kept, cut))  # epoch 1, interrupted
    assert head == whole[1][: len(head)]
    state = kept.state_dict()
    assert (state["epoch"], state["consumed"]) == (1, min(cut * BATCH, N))
    rest = flat(batches(kept))  # the same workers go on from where delivery stopped
    assert head + rest == whole[1]
    assert flat(batches(kept)) == whole[2]
    resumed = StreamingDataLoader(make(ds), num_workers=2, persistent_workers=True)
    resumed.load_state_dict(state)
    assert head + flat(batches(resumed)) == whole[1]


def test_spawned_workers_open_their_own_tier(ds: Path) -> None:
    """Spawned workers unpickle the dataset: its location reopens its tier in the worker."""
    reference = [s["__key__"] for s in make(ds)]
    loader = StreamingDataLoader(make(ds), num_workers=1, multiprocessing_context="spawn")
    assert flat(batches(loader)) == reference


def test_the_epoch_advances_when_it_ends(ds: Path) -> None:
    loader = StreamingDataLoader(make(ds), num_workers=2)
    first = flat(batches(loader))
    assert (loader.epoch, loader.consumed) == (1, 0)
    second = flat(batches(loader))
    assert sorted(first) == sorted(second) and first != second


def test_damage_in_a_worker_names_the_shard_in_the_main_process(
    tmp_path: Path,
) -> None:
    write_dataset(tmp_path, n=N)
    flip_byte(shard_path(tmp_path / "ds", 3), 100)
    loader = StreamingDataLoader(make(tmp_path / "ds", shuffle=False), num_workers=2)
    with pytest.raises(ShardDamagedError, match=r"shard-000003\.tar"):
        batches(loader)


def test_settings_that_would_break_the_position_are_refused(ds: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        StreamingDataLoader(make(ds), batch_size=BATCH + 1)
    with pytest.raises(ValueError, match="in_order=False"):
        StreamingDataLoader(make(ds), num_workers=2, in_order=False)


class CountingTier(LocalTier):
    """A local tier that logs every ranged read (from any process) to a file."""

    def __init__(self, root: Path, log: Path) -> None:
        super().__init__(root, name="counting")
        self.log = log

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = super().get(key, start, end)
        with self.log.open("a") as f:
            f.write(f"{key} {start} {len(data)}\n")
        return data


def test_workers_share_one_download_per_shard(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=N)
    log = tmp_path / "reads.log"
    dataset = make(CountingTier(tmp_path, log), prefix="ds", cache_dir=tmp_path / "cache")
    assert sorted(flat(batches(StreamingDataLoader(dataset, num_workers=2)))) == sorted(expected(N))
    fetched = Counter[str]()
    for line in log.read_text().splitlines():
        key, _, length = line.split()
        if key.endswith(".tar"):
            fetched[key.rsplit("/", 1)[1]] += int(length)
    # Both workers read every shard (batches interleave), yet each shard came down once.
    assert fetched == {s.name: s.size for s in manifest.shards}


class ThreadCountingTier(LocalTier):
    """A local tier whose shard reads log their process and its range-read threads alive."""

    def __init__(self, root: Path, log: Path) -> None:
        super().__init__(root, name="thread-counting")
        self.log = log

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.endswith(".tar"):
            threads = sum(t.name == "range-fetch" for t in threading.enumerate())
            with self.log.open("a") as f:
                f.write(f"{os.getpid()} {threads}\n")
        return super().get(key, start, end)


def _range_threads(tmp_path: Path, workers: int, **kwargs: Any) -> dict[str, int]:
    """Each process that streamed a shard: the most range-read threads it ran at once."""
    write_dataset(tmp_path, n=N)
    log = tmp_path / f"threads-{workers}.log"
    tier = ThreadCountingTier(tmp_path, log)
    cache = tmp_path / f"cache-{workers}"
    dataset = make(tier, prefix="ds", cache_dir=cache, **kwargs)
    loader = StreamingDataLoader(dataset, num_workers=workers)
    assert sorted(flat(batches(loader))) == sorted(expected(N))
    most: dict[str, int] = {}
    for line in log.read_text().splitlines():
        pid, threads = line.split()
        most[pid] = max(most.get(pid, 0), int(threads))
    return most


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize(("workers", "each"), [(0, 8), (1, 8), (2, 4), (4, 2)])
def test_the_default_range_reads_are_split_among_the_workers(
    tmp_path: Path, workers: int, each: int
) -> None:
    """8 range reads per node by default: a process alone runs 8, 4 workers 2 each."""
    most = _range_threads(tmp_path, workers)
    assert most  # the shards were streamed
    assert set(most.values()) == {each}
    assert (os.getpid() in map(int, most)) == (workers == 0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_a_range_parallel_given_is_kept_per_worker(tmp_path: Path) -> None:
    most = _range_threads(tmp_path, 4, range_parallel=3)
    assert most
    assert set(most.values()) == {3}


def test_the_cache_stays_within_its_limit_for_a_larger_dataset(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, n=120)
    largest = max(s.size for s in manifest.shards)
    limit = 3 * largest
    assert manifest.nbytes > 2 * limit, "the dataset must not fit in the cache"
    cache = tmp_path / "cache"
    dataset = make(tmp_path / "ds", cache_dir=cache, cache_limit=limit, shuffle_window=1)
    peak = 0
    stop = threading.Event()

    def watch() -> None:  # measured while the workers download, not only between batches
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, dir_bytes(cache / "blobs") + dir_bytes(cache / "tmp"))
            stop.wait(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        seen = flat(batches(StreamingDataLoader(dataset, num_workers=2)))
    finally:
        stop.set()
        watcher.join()
    assert sorted(seen) == sorted(f"s{i:05d}" for i in range(120))
    assert 0 < peak <= limit + largest + 4096  # + one shard in use (+ small index entries)
    assert dir_bytes(cache / "blobs") < manifest.nbytes  # it did evict


# --- the fork server's preload ------------------------------------------------------


def test_a_main_module_run_with_dash_m_is_preloaded_by_the_fork_server() -> None:
    """``python -m NAME``: the fork server imports NAME once; its workers find it imported.

    Without that, every worker of every epoch imported the main module, and all
    it imports, again (multiprocessing preloads only a main module run from a path).
    """
    repo = Path(__file__).resolve().parents[3]
    path = os.pathsep.join([str(repo / "src"), str(repo)])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "tests.data.loading.forkmain"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert pids["imported_in"] != pids["worker"], (
        "the worker had to import the main module's imports"
    )
    assert pids["imported_in"] != pids["parent"]  # in the fork server
    # The module itself is forgotten there, so the worker's runpy does not warn that it
    # found it in sys.modules ("this may result in unpredictable behaviour").
    assert pids["named"] is False
    assert pids["env_left"] is False  # the name is not passed on to other children
    assert "RuntimeWarning" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "preloaded"),
    [("trainer.run", "trainer.run"), ("trainer.__main__", None), ("__main__", None), (None, None)],
)
def test_which_main_module_is_preloaded(
    monkeypatch: pytest.MonkeyPatch, name: str | None, preloaded: str | None
) -> None:
    """A package's ``__main__`` (which starts the program at import) or a script is not named."""
    main = types.ModuleType("__main__")
    main.__spec__ = None if name is None else importlib.machinery.ModuleSpec(name, None)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert main_module_by_name() == preloaded
