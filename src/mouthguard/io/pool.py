"""The process's one thread pool for blocking I/O, sized once, exit-safe.

Every large transfer mouthguard runs in parallel goes through :data:`SHARED`:
the write pipeline's ``pwrite`` blocks (:mod:`~mouthguard.io.direct_write`, so
every large ``LocalTier.put``), checkpoint loads' ranged reads
(:mod:`~mouthguard.io.read_ahead`, :mod:`~mouthguard.io.host_ring`) and the
weights loader's reads (:mod:`~mouthguard.weights.pipeline`). They compete for
the same disk, so they share one set of threads instead of each sizing its own.

**Sizing rule.** :data:`IO_THREADS` (8) threads, or ``MOUTHGUARD_IO_THREADS``
(1 to :data:`MAX_IO_THREADS`) read once, when the pool starts its first task.
The threads spend their time in the kernel (``pwrite``, ``preadv`` and
object-store requests release the GIL), so the CPU count does not bound them;
the device's queue does. Eight was the weights loader's own pool, chosen
because virtual and network disks reach their speed only with many requests
queued, and is the largest of the three pools this one replaces (writes 4,
checkpoint reads 4, weights reads 8).

**Bound.** At most that many threads, whatever the number of callers. Tasks
waiting for a thread are bounded by their callers, each of which keeps a fixed
number in flight and waits for the oldest before submitting more: a file being
written at most ``IN_FLIGHT`` (4) blocks, a file being read at most ``ahead``
reads (8 for checkpoints, 4 for weights). No task submits to the pool and waits
on it, so a full pool delays work and never deadlocks it.

Work submitted after the interpreter began to exit -- when executors refuse new
work -- runs in the caller's thread instead, so an async save still in flight at
a normal exit completes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from mouthguard.errors import ConfigError

T = TypeVar("T")

#: Threads of the shared pool unless ``MOUTHGUARD_IO_THREADS`` says otherwise.
IO_THREADS = 8
#: The largest ``MOUTHGUARD_IO_THREADS`` accepted (a typo of 800 is refused, not obeyed).
MAX_IO_THREADS = 64
#: The environment variable that overrides :data:`IO_THREADS`.
IO_THREADS_ENV = "MOUTHGUARD_IO_THREADS"
#: Name prefix of the shared pool's threads (what a thread dump shows).
THREAD_PREFIX = "mouthguard-io"


def io_threads(environ: Mapping[str, str] | None = None) -> int:
    """The shared pool's size: ``MOUTHGUARD_IO_THREADS`` if set, else :data:`IO_THREADS`.

    Raises:
        ConfigError: the variable is not a whole number from 1 to :data:`MAX_IO_THREADS`.
    """
    raw = (os.environ if environ is None else environ).get(IO_THREADS_ENV)
    if raw is None:
        return IO_THREADS
    try:
        threads = int(raw.strip())
    except ValueError:
        threads = 0
    if not 1 <= threads <= MAX_IO_THREADS:
        raise ConfigError(
            f"{IO_THREADS_ENV}={raw!r}: expected a whole number of threads "
            f"from 1 to {MAX_IO_THREADS}"
        )
    return threads


class IOPool:
    """A lazily created :class:`ThreadPoolExecutor` with an exit-safe ``submit``.

    Args:
        threads: its size; None sizes it by :func:`io_threads` when the first
            task is submitted (once: later changes of the environment are ignored).
        name: the prefix of its threads' names.
    """

    def __init__(self, threads: int | None, name: str) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"an I/O pool needs at least one thread, not {threads}")
        self._threads, self._name = threads, name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def threads(self) -> int:
        """The most threads this pool runs (resolved now if it was left to the environment)."""
        with self._lock:
            if self._threads is None:
                self._threads = io_threads()
            return self._threads

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """Run ``fn(*args)`` on the pool, or here if the interpreter is exiting.

        The returned future carries the result or the exception either way.
        """
        threads = self.threads
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(threads, thread_name_prefix=self._name)
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


#: The one pool every large transfer of this process runs on (see the module docstring).
SHARED = IOPool(None, THREAD_PREFIX)
