"""One rank of a peer-memory benchmark job (what it measures: the package docstring)."""

from __future__ import annotations

import cProfile
import datetime as dt
import io
import os
import pstats
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mouthguard
from benchmarks.peer_memory import (
    JOB_TIMEOUT_SECONDS,
    PROFILE_LINES,
    RECOVERIES,
    SOURCES,
    WORLD,
)
from benchmarks.state import build_state
from mouthguard.checkpoint.peer_memory import NodeArea
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.s3 import S3Tier


@dataclass(frozen=True)
class JobConfig:
    """What every rank of one job is given (picklable: it crosses ``spawn``).

    Attributes:
        port: the parent's TCPStore on 127.0.0.1.
        root: the job's directory on the benchmarked disk.
        shm: the job's directory under /dev/shm (each node's area below it).
        nbytes: state per rank.
        rounds: ``save_async`` calls per disk/peer checkpointer.
        profile: run one more peer and S3 recovery each under cProfile, after the timed ones.
        s3: ``S3Tier`` keyword arguments with ``url`` (a prefix of its own for
            this job), or ``None`` when S3 is not run.
    """

    port: int
    root: str
    shm: str
    nbytes: int
    rounds: int
    profile: bool
    s3: dict[str, Any] | None


def rank_main(rank: int, config: JobConfig, results: Any) -> None:
    """Join the job as ``rank`` (node ``rank // 2``), run it, put ``(rank, result)``."""
    os.environ["GROUP_RANK"] = str(rank // 2)  # 2 nodes of 2
    timeout = dt.timedelta(seconds=JOB_TIMEOUT_SECONDS)
    store = dist.TCPStore("127.0.0.1", config.port, WORLD, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    try:
        results.put((rank, _job(rank, config)))
    finally:
        dist.destroy_process_group()


def _evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (a cold read follows)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _checkpointers(config: JobConfig) -> dict[str, mouthguard.Checkpointer]:
    """The plain (disk), peer-memory and, when configured, S3 checkpointers."""
    disk = mouthguard.Store([LocalTier(Path(config.root) / "disk")])
    peers = mouthguard.PeerMemory(path=Path(config.shm))
    ckpts = {
        "disk": mouthguard.Checkpointer(disk, run="plain", background=False),
        "peers": mouthguard.Checkpointer(disk, run="peers", background=False, peers=peers),
    }
    if config.s3 is not None:
        options = dict(config.s3)
        tier = S3Tier(options.pop("url"), **options)
        ckpts["s3"] = mouthguard.Checkpointer(mouthguard.Store([tier]), run="s3", background=False)
    return ckpts


def _saves(
    ckpts: dict[str, mouthguard.Checkpointer], state: dict[str, torch.Tensor], rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The stall rounds (disk and peers alternating); per checkpointer, stalls and saves."""
    stall: dict[str, list[float]] = {"plain": [], "peers": []}
    save: dict[str, list[float]] = {"plain": [], "peers": []}
    for step in range(1, rounds + 1):
        order = [("plain", ckpts["disk"]), ("peers", ckpts["peers"])]
        for name, ckpt in order if step % 2 else order[::-1]:
            info = ckpt.save_async(step, state).result(timeout=JOB_TIMEOUT_SECONDS)
            stall[name].append(float(info.stall_seconds or 0.0))
            save[name].append(float(info.save_seconds or 0.0))
    if "s3" in ckpts:
        ckpts["s3"].save(rounds, state)
    return stall, save


def _timed(load: Callable[[], Any], profile: bool) -> tuple[float, Any, str]:
    """``load()``'s seconds, its result, and its profile's top lines ('' unless ``profile``)."""
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    loaded = load()
    seconds = time.perf_counter() - started
    if profiler is None:
        return seconds, loaded, ""
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(PROFILE_LINES)
    return seconds, loaded, text.getvalue()


def _prepare(source: str, rank: int, config: JobConfig) -> None:
    """Make the next ``source`` recovery a recovery: cold pages, or node 1's memory lost."""
    if source == "disk":
        name = f"rank-{rank:05d}.safetensors"
        _evict(Path(config.root) / "disk" / "plain" / f"{config.rounds:012d}" / name)
    dist.barrier()
    if source == "peers":
        # Again before every recovery: the previous one gave node 1 its files back.
        if rank == 2:
            shutil.rmtree(Path(config.shm) / "node-node1")
        dist.barrier()


def _job(rank: int, config: JobConfig) -> dict[str, Any]:
    state = build_state(config.nbytes, seed=rank)
    ckpts = _checkpointers(config)
    for ckpt in ckpts.values():
        ckpt.prepare(state)
    stall, save = _saves(ckpts, state, config.rounds)
    held = sum(h.nbytes for h in NodeArea(Path(config.shm), f"node{rank // 2}").held("peers"))
    seconds: dict[str, list[float]] = {source: [] for source in ckpts}
    profiles: dict[str, str] = {}
    same, tiers = True, {source: [] for source in ckpts}  # what each recovery loaded
    profiled_seconds: dict[str, float] = {}
    # With a profile: one more peer-memory and S3 recovery each, under cProfile, after
    # the timed ones and counted in none of them (the profiler slows what it watches).
    extra = [(RECOVERIES, s) for s in SOURCES if s in ckpts and s != "disk" and config.profile]
    timed = [(attempt, s) for attempt in range(RECOVERIES) for s in SOURCES if s in ckpts]
    for attempt, source in timed + extra:
        _prepare(source, rank, config)
        took, loaded, profiled = _timed(ckpts[source].load, attempt == RECOVERIES)
        if profiled:
            profiles[source], profiled_seconds[source] = profiled, took
        else:
            seconds[source].append(took)
        same = same and all(torch.equal(loaded.state[k], v) for k, v in state.items())
        tiers[source].append((loaded.step, loaded.tier))
        del loaded  # the next recovery starts from nothing held
    for ckpt in ckpts.values():
        ckpt.close()
    return {
        "stall": stall,
        "save": save,
        "seconds": seconds,
        "tiers": tiers,
        "same": same,
        "node_bytes": held,
        "profiles": profiles,
        "profiled_seconds": profiled_seconds,
    }
