"""Starting a benchmark job (4 spawned gloo ranks) and the S3 server its durable tier uses."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks.peer_memory import JOB_TIMEOUT_SECONDS, WORLD
from benchmarks.peer_memory.job import JobConfig, rank_main
from benchmarks.state import size_label


@dataclass(frozen=True)
class S3Target:
    """Where the jobs' S3 checkpoints go: ``options`` for ``S3Tier`` (less ``url``).

    ``why_not``: when S3 is not run, why (``options`` is then ``None``).
    """

    options: dict[str, Any] | None
    bucket: str = ""
    version: str = ""
    why_not: str = ""

    def for_job(self, nbytes: int) -> dict[str, Any] | None:
        """The options with a ``url`` under a prefix of this size's own."""
        if self.options is None:
            return None
        return {**self.options, "url": f"s3://{self.bucket}/{size_label(nbytes)}/"}


@contextmanager
def s3_target() -> Iterator[S3Target]:
    """A throwaway Ceph RGW on 127.0.0.1 with a fresh bucket, stopped when the block ends.

    Where the Ceph programs are missing, the target says so and runs nothing; a
    server that is installed but does not start is an error (the run would
    otherwise silently lose its S3 column).
    """
    from tests.s3.ceph import CephCluster, missing_binaries  # noqa: PLC0415 - the tests' launcher
    from tests.s3.fixtures import S3Server, ceph_version  # noqa: PLC0415

    if missing := missing_binaries():
        yield S3Target(None, why_not=f"Ceph programs missing: {', '.join(missing)}")
        return
    with CephCluster() as endpoint:
        server = S3Server(endpoint.endpoint, endpoint.access_key, endpoint.secret_key)
        bucket = f"peer-memory-{uuid.uuid4().hex[:12]}"
        server.client().create_bucket(Bucket=bucket)
        yield S3Target(server.tier_options(), bucket, ceph_version())


def run_size(
    nbytes: int, rounds: int, disk: Path, s3: S3Target, *, profile: bool = False
) -> list[dict[str, Any]]:
    """One 4-rank job at ``nbytes`` per rank, its disk under ``disk``; every rank's result.

    Raises:
        RuntimeError: a rank failed or the job ran past ``JOB_TIMEOUT_SECONDS``.
    """
    ctx = mp.get_context("spawn")
    timeout = dt.timedelta(seconds=JOB_TIMEOUT_SECONDS)
    server = dist.TCPStore(
        "127.0.0.1", 0, WORLD, is_master=True, wait_for_workers=False, timeout=timeout
    )
    results = ctx.Queue()
    with (
        tempfile.TemporaryDirectory(dir=disk) as root,
        tempfile.TemporaryDirectory(dir="/dev/shm") as shm,
    ):
        config = JobConfig(server.port, root, shm, nbytes, rounds, profile, s3.for_job(nbytes))
        procs = [ctx.Process(target=rank_main, args=(r, config, results)) for r in range(WORLD)]
        for proc in procs:
            proc.start()
        got: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
        try:
            while len(got) < WORLD:
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"peer-memory benchmark job failed at {size_label(nbytes)}")
                try:
                    rank, value = results.get(timeout=1.0)
                    got[rank] = value
                except Exception:  # noqa: BLE001 - queue.Empty: poll the processes again
                    continue
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
    return [got[r] for r in range(WORLD)]
