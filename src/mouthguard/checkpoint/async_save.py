"""Async saves: the caller waits for a snapshot, a background thread does the rest.

:class:`AsyncSaver` owns one :class:`~mouthguard.checkpoint.staging.StagingBuffer`
and one background thread. ``submit`` first waits for the previous save (one
save in flight: memory stays at one staging copy however fast saves come, and
the disk is never asked to absorb two bursts at once), then runs the snapshot in
the caller's thread and returns a :class:`SaveHandle`. The background job writes,
checksums and commits the staged image; its result or error is delivered through
the handle.

Error contract: an error in the background is re-raised by
:meth:`SaveHandle.result`; it is also logged, so a save whose handle nobody asks
is never lost silently. A failed save commits nothing.

At interpreter exit the background thread is joined (``concurrent.futures``
does so), so a save in flight at a normal exit still commits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from mouthguard.checkpoint.info import CheckpointInfo
from mouthguard.checkpoint.staging import StagingBuffer

log = logging.getLogger(__name__)


class SaveHandle:
    """A save in progress. Finished means committed, or failed with nothing committed.

    Attributes:
        run: the run.
        step: the step being saved.
        stall_seconds: how long ``save_async`` blocked the caller (waiting for the
            previous save, plus the snapshot).
        waited_seconds: the part of the stall spent waiting for the previous save.
    """

    def __init__(
        self,
        run: str,
        step: int,
        future: Future[CheckpointInfo],
        *,
        stall_seconds: float,
        waited_seconds: float,
    ) -> None:
        self.run = run
        self.step = step
        self.stall_seconds = stall_seconds
        self.waited_seconds = waited_seconds
        self._future = future

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the save finishes; return False on timeout. Never raises its error."""
        try:
            self._future.exception(timeout)
        except FutureTimeout:
            return False
        return True

    def result(self, timeout: float | None = None) -> CheckpointInfo:
        """The committed checkpoint's info (with ``stall_seconds``), or the save's error.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds.
            MouthguardError: the save failed (nothing was committed).
        """
        try:
            return self._future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(
                f"save of {self.run} step {self.step} still running after {timeout} s"
            ) from None

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"SaveHandle(run={self.run!r}, step={self.step}, {state})"


@dataclass(frozen=True)
class Snapshot:
    """What a snapshot hands to the background job."""

    stall_seconds: float
    waited_seconds: float


class AsyncSaver:
    """One staging buffer, one background thread, one save in flight."""

    def __init__(self, name: str) -> None:
        self.staging = StagingBuffer()
        self._executor: ThreadPoolExecutor | None = None
        self._name = name
        self._last: Future[CheckpointInfo] | None = None

    def wait_previous(self) -> float:
        """Block until the save in flight (if any) finished; return the seconds waited."""
        started = time.perf_counter()
        if self._last is not None:
            self._last.exception()  # its error belongs to its own handle
        return time.perf_counter() - started

    def submit(
        self, run: str, step: int, job: Callable[[], CheckpointInfo], snapshot: Snapshot
    ) -> SaveHandle:
        """Run ``job`` (write and commit the staged image) in the background."""
        if self._executor is None:
            # One thread of its own, not io.pool.SHARED: it orders this checkpointer's
            # saves, and a save waits on its writes, which run on SHARED (io.direct_write).
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix=f"mouthguard-save-{self._name}"
            )
        future = self._executor.submit(_logged(run, step, job))
        self._last = future
        return SaveHandle(
            run,
            step,
            future,
            stall_seconds=snapshot.stall_seconds,
            waited_seconds=snapshot.waited_seconds,
        )

    def close(self) -> None:
        """Wait for the save in flight, stop the thread and free the staging buffer."""
        self.wait_previous()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.staging.release()


def _logged(run: str, step: int, job: Callable[[], CheckpointInfo]) -> Callable[[], CheckpointInfo]:
    """``job``, logging its failure before the handle can see it (nothing is lost silently)."""

    def run_job() -> CheckpointInfo:
        try:
            return job()
        except BaseException as exc:
            # The handle carries the traceback; the log line is for when nobody asks.
            log.error("async save of %s step %d failed, nothing committed: %s", run, step, exc)  # noqa: TRY400
            raise

    return run_job
