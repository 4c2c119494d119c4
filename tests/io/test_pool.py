"""The one I/O pool: sized once, exit-safe, and the only threads large transfers run on."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typing_extensions import override

from mouthguard import weights
from mouthguard.errors import ConfigError
from mouthguard.io.pool import (
    IO_THREADS,
    IO_THREADS_ENV,
    MAX_IO_THREADS,
    SHARED,
    THREAD_PREFIX,
    IOPool,
    io_threads,
)
from mouthguard.io.read_ahead import read_in_order
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.weights.helpers import assert_equal, model_state, write_sharded

#: Names the three pools this one replaced gave their threads.
FORMER_POOLS = ("mouthguard-read", "mouthguard-weights-read")


def _where() -> str:
    return threading.current_thread().name


def test_work_runs_on_the_pool_threads() -> None:
    pool = IOPool(2, "test-io")
    assert pool.submit(_where).result(timeout=10).startswith("test-io")


def test_once_executors_refuse_work_it_runs_in_the_caller() -> None:
    pool = IOPool(2, "test-io")
    pool.submit(_where).result(timeout=10)
    assert pool._executor is not None
    pool._executor.shutdown()  # what interpreter exit does to every executor
    assert pool.submit(_where).result(timeout=10) == threading.current_thread().name

    def fail() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        pool.submit(fail).result(timeout=10)


def test_the_size_comes_from_the_environment_or_the_default() -> None:
    assert io_threads({}) == IO_THREADS == 8
    assert io_threads({IO_THREADS_ENV: " 3 "}) == 3
    assert io_threads({IO_THREADS_ENV: str(MAX_IO_THREADS)}) == MAX_IO_THREADS


@pytest.mark.parametrize("bad", ["0", "-2", "many", "", "2.5", str(MAX_IO_THREADS + 1)])
def test_a_bad_size_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match=IO_THREADS_ENV):
        io_threads({IO_THREADS_ENV: bad})


def test_a_pool_sized_by_the_environment_reads_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IO_THREADS_ENV, "3")
    pool = IOPool(None, "test-env")
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> str:
        started.release()
        release.wait(timeout=30)
        return _where()

    futures = [pool.submit(hold) for _ in range(10)]
    for _ in range(3):
        assert started.acquire(timeout=30)
    monkeypatch.setenv(IO_THREADS_ENV, "9")  # too late: the pool is sized
    release.set()
    names = {f.result(timeout=30) for f in futures}
    assert len(names) == 3 == pool.threads


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        IOPool(0, "none")


class _Recording(WrappedTier):
    """A local tier that notes the thread of every ranged read."""

    def __init__(self, inner: LocalTier) -> None:
        super().__init__(inner)
        self.readers: set[str] = set()
        self._lock = threading.Lock()

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        with self._lock:
            self.readers.add(_where())
        super().read_into(key, offset, out)


def test_writes_checkpoint_reads_and_weights_share_one_bounded_pool(tmp_path: Path) -> None:
    """Everything at once: three large writes, two ordered reads, a weights load.

    Every read runs on the shared pool's threads, and however many callers there
    are, the process never holds more of them than the pool's size (an executor
    keeps the threads it started, so the live ones are all it ever had).
    """
    local = LocalTier(tmp_path / "tier")
    tier = _Recording(local)
    blob = os.urandom(3 * 1024 * 1024 + 5)
    local.put("blob", blob)
    chunk = 256 * 1024

    def write(n: int) -> None:
        local.put(f"big/{n}", blob * 12)  # 36 MiB: more than one 32 MiB block in flight

    def read() -> bytes:
        buffers = [bytearray(chunk) for _ in range(-(-len(blob) // chunk))]
        jobs = [
            (i * chunk, memoryview(b)[: min(chunk, len(blob) - i * chunk)])
            for i, b in enumerate(buffers)
        ]
        return b"".join(bytes(v) for v in read_in_order(tier, "blob", jobs, ahead=4))

    state = model_state()
    model = write_sharded(tmp_path / "tier" / "model", state)
    with ThreadPoolExecutor(6) as callers:
        writes = [callers.submit(write, n) for n in range(3)]
        reads = [callers.submit(read) for _ in range(2)]
        loaded = callers.submit(weights.load, tier, prefix=model.name)
        for w in writes:
            w.result(timeout=300)
        assert all(r.result(timeout=300) == blob for r in reads)
        assert_equal(loaded.result(timeout=300).tensors, state)
    assert all(local.head(f"big/{n}").size == 12 * len(blob) for n in range(3))

    assert tier.readers and all(name.startswith(THREAD_PREFIX) for name in tier.readers)
    live = [t.name for t in threading.enumerate()]
    assert 0 < len([n for n in live if n.startswith(f"{THREAD_PREFIX}_")]) <= SHARED.threads
    assert not [n for n in live if n.startswith(FORMER_POOLS)]
