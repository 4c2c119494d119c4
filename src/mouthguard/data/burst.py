"""Yielding to checkpoint bursts: the signal a loader's prefetch waits on.

A checkpoint save is a burst that should have the disk and the network to
itself; a loader prefetching the next shards at the same moment stretches the
training stall. :class:`BurstSignal` is the shape of
:class:`mouthguard.jobs.burst.BurstGate` (``busy`` and a bounded ``wait``), so
the store's gate can be passed as it is; this package does not import ``jobs``.

DataLoader worker processes cannot see an object of the main process, so
:class:`SharedBurst` mirrors one into a flag in shared memory: a thread of the
main process polls the signal and sets the flag, the workers read it.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any, Protocol, runtime_checkable

#: How often the mirror polls the main process's signal, and a worker its flag.
POLL_SECONDS = 0.05


@runtime_checkable
class BurstSignal(Protocol):
    """Whether a checkpoint burst is in flight, and a bounded wait for it to end."""

    @property
    def busy(self) -> bool:
        """Whether background I/O should yield right now."""

    def wait(self, timeout: float) -> float:
        """Block while busy, at most ``timeout`` seconds; return the seconds waited."""


class SharedBurst:
    """A process-shared mirror of a :class:`BurstSignal` (see the module docstring).

    Created in the main process before the DataLoader starts its workers, which
    inherit the shared flag. :meth:`stop` ends the mirror thread.
    """

    def __init__(self, source: BurstSignal) -> None:
        self._flag: Any = mp.get_context().Value("b", 0, lock=False)
        self._source: BurstSignal | None = source
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._mirror, name="burst mirror", daemon=True)
        self._thread.start()

    def _mirror(self) -> None:
        while not self._stop.is_set():
            source = self._source
            self._flag.value = 1 if source is not None and source.busy else 0
            self._stop.wait(POLL_SECONDS)

    @property
    def busy(self) -> bool:
        """Whether the mirrored signal was busy at the last poll."""
        return bool(self._flag.value)

    def wait(self, timeout: float) -> float:
        """Poll the flag until it clears or ``timeout`` passes; return the seconds waited."""
        start = time.monotonic()
        while self.busy and time.monotonic() - start < timeout:
            time.sleep(POLL_SECONDS)
        return time.monotonic() - start

    def stop(self) -> None:
        """Stop mirroring (the flag clears)."""
        self._stop.set()
        self._flag.value = 0

    def __getstate__(self) -> dict[str, Any]:
        # Workers get the flag only: the source and the mirror thread stay in the main process.
        return {"_flag": self._flag, "_source": None, "_stop": None, "_thread": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
