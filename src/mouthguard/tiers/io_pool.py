"""A process-wide thread pool for blocking I/O that keeps working while the interpreter exits.

Writes and reads of large objects run on small shared pools (``pwrite``,
``preadv`` and object-store requests release the GIL). Two rules they share:
the pool is created on first use, once per process; and work submitted after
the interpreter began to exit -- when executors refuse new work -- runs in the
caller's thread instead, so an async save still in flight at a normal exit
completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class IOPool:
    """A lazily created, shared :class:`ThreadPoolExecutor` with an exit-safe ``submit``."""

    def __init__(self, threads: int, name: str) -> None:
        self._threads, self._name = threads, name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Run ``fn(*args)`` on the pool, or here if the interpreter is exiting.

        The returned future carries the result or the exception either way.
        """
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            executor = self._executor
        try:
            return executor.submit(fn, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            done: Future[T] = Future()
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                done.set_exception(exc)
            return done
