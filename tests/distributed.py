"""Run a function in N real ``torch.distributed`` processes (gloo, loopback) from a test.

Usage::

    from tests.distributed import run_distributed

    def _work(rank: int, world_size: int, root: str) -> int:   # module level: picklable
        ...                                                     # the process group is up
        return rank * 10

    results = run_distributed(_work, 2, str(tmp_path))          # -> [0, 10]

Contract:

* ``fn`` runs in ``world_size`` fresh processes (``spawn``: no state inherited
  from pytest) as ``fn(rank, world_size, *args)`` with the default process group
  already initialised (backend ``gloo``, rendezvous on 127.0.0.1). ``fn`` and
  ``args`` must be picklable -- define ``fn`` at module level in an importable test
  module; its return value must be picklable too.
* Rendezvous uses a ``TCPStore`` that the parent opens on a free port (port 0)
  and holds for the whole run, so concurrent test runs never race for a port.
* Returns the ranks' return values, in rank order.
* If any rank raises, :class:`DistributedTestError` is raised in the parent with
  every failing rank's traceback text (and an exception that is a DCP
  ``CheckpointException`` is just one more exception here: catch it *inside* ``fn``
  when a test expects a failure and return what it wants to assert on).
* Bounded: collectives time out after ``timeout`` seconds, and the whole run is
  killed after ``timeout`` seconds plus start-up time, or ``timeout`` seconds after
  the first rank failed (a rank that hangs or dies without reporting fails the
  run; it never hangs the test suite).
* Each spawn costs about two seconds (the child imports torch): share one run
  across several assertions where you can.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

#: Seconds a child may take to start (import torch) before its work timeout begins.
STARTUP_SECONDS = 60.0


class DistributedTestError(AssertionError):
    """One or more ranks failed (or hung); the message holds their tracebacks."""


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    timeout: float,
    args: tuple[Any, ...],
    results: Any,
) -> None:
    # Children must not inherit settings that would redirect the rendezvous.
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=False, timeout=dt.timedelta(seconds=timeout)
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=dt.timedelta(seconds=timeout),
        )
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:  # everything goes back to the parent, as text
        results.put((rank, False, traceback.format_exc()))
        return
    results.put((rank, True, value))


def run_distributed(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; see the module doc.

    Raises:
        DistributedTestError: a rank raised, died without reporting, or the run
            exceeded its time limit.
    """
    ctx = mp.get_context("spawn")
    # The parent holds the rendezvous store: port 0 picks a free port atomically.
    server = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=dt.timedelta(seconds=timeout + STARTUP_SECONDS),
    )
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, server.port, timeout, args, results),
            name=f"rank-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    reports: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout + STARTUP_SECONDS
    dead_since: dict[int, float] = {}
    try:
        while len(reports) < world_size:
            now = time.monotonic()
            if now > deadline:
                raise DistributedTestError(
                    _summary(reports, world_size, f"timed out after {timeout + STARTUP_SECONDS}s")
                )
            try:
                rank, ok, value = results.get(timeout=0.2)
                reports[rank] = (ok, value)
                if not ok:
                    # The others fail within one collective timeout, or are stuck.
                    deadline = min(deadline, time.monotonic() + timeout)
                continue
            except queue.Empty:
                pass
            for rank, proc in enumerate(procs):
                if rank in reports or proc.exitcode is None:
                    continue
                # Exited: give its last message a moment to arrive through the pipe.
                first = dead_since.setdefault(rank, now)
                if now - first > 2.0:
                    reports[rank] = (False, f"process exited with code {proc.exitcode}")
    finally:
        complete = len(reports) == world_size
        for proc in procs:
            # After a failure or timeout nobody waits for a hung rank: kill at once.
            proc.join(timeout=10 if complete else 0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
    if not all(ok for ok, _ in reports.values()):
        raise DistributedTestError(_summary(reports, world_size, "ranks failed"))
    return [reports[rank][1] for rank in range(world_size)]


def _summary(reports: dict[int, tuple[bool, Any]], world_size: int, what: str) -> str:
    lines = [f"run_distributed: {what}"]
    for rank in range(world_size):
        if rank not in reports:
            lines.append(f"--- rank {rank}: no report (hung or still starting)")
        elif not reports[rank][0]:
            lines.append(f"--- rank {rank} failed:\n{reports[rank][1]}")
    return "\n".join(lines)
