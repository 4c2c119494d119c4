"""The shared I/O pool: work runs on it, or in the caller once executors refuse work."""

from __future__ import annotations

import threading

import pytest

from mouthguard.tiers.io_pool import IOPool


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
