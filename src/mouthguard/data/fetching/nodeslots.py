"""A per-node limit on range requests in flight, shared by every process that names it.

Each DataLoader worker has its own :class:`~mouthguard.data.fetching.rangefetch.RangeFetcher`
(``range_parallel`` requests in flight), and a node runs several workers, often
of several ranks: without a shared bound a node has ``ranks * workers *
range_parallel`` requests in flight. :class:`NodeSlots` is a pool of ``count``
slot files in one directory (the shard cache's ``slots/``, shared by the
processes that use that cache); a request holds one slot, an exclusive
``flock`` on its file, while it is in flight. So:

* **Bound.** At most ``count`` requests hold a slot at once across every
  process and thread using the directory with the same ``count`` (each
  acquisition opens its own file description, so threads of one process
  contend as processes do).
* **Crashes.** The kernel drops a dead process's locks: a killed worker never
  leaks a slot.
* **Forks.** The slots are :mod:`mouthguard.io.forklocks` descriptors: a worker
  forked while a request of this process is in flight does not keep its slot.
* **Waiting.** A request that finds every slot taken polls every
  :data:`_POLL` seconds (a request lasts milliseconds to seconds; a wait of a
  millisecond more is noise), in no particular order: no fairness is promised.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from mouthguard.io.forklocks import close_lock_file, open_lock_file

#: Seconds between looks at the slots while all are taken.
_POLL = 0.001


class NodeSlots:
    """``count`` request slots in ``directory``; see the module docstring.

    Raises:
        ValueError: ``count`` is below 1.
    """

    def __init__(self, directory: str | os.PathLike[str], count: int) -> None:
        if count < 1:
            raise ValueError(f"a node's requests in flight must be >= 1, not {count}")
        self.directory = Path(directory)
        self.count = count
        self.directory.mkdir(parents=True, exist_ok=True)
        self._paths = [self.directory / f"slot-{i}" for i in range(count)]
        self._next = os.getpid() % count  # processes start their search at different slots

    @contextlib.contextmanager
    def held(self, timeout: float | None = None) -> Iterator[int]:
        """Hold a slot for the body's duration; waits while all are taken.

        Raises:
            TimeoutError: no slot came free within ``timeout`` seconds (None: wait on).
        """
        fd = self._take(None if timeout is None else time.monotonic() + timeout)
        try:
            yield fd
        finally:
            close_lock_file(fd)  # closing the only descriptor drops the flock

    def _take(self, deadline: float | None) -> int:
        while True:
            start = self._next
            for i in range(self.count):
                path = self._paths[(start + i) % self.count]
                fd = open_lock_file(path)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    close_lock_file(fd)
                    continue
                except BaseException:
                    close_lock_file(fd)
                    raise
                self._next = (start + i + 1) % self.count
                return fd
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"all {self.count} request slots in {self.directory} are taken")
            time.sleep(_POLL)
