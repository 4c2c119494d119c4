"""Peer memory: resuming after a lost node from peer memory vs from the local disk read
cold, and the stall of ``save_async`` with peer replication vs a plain async save.

``python -m benchmarks.peer_memory`` starts 4 gloo ranks on loopback as 2
simulated nodes of 2 (torchrun's ``GROUP_RANK``), once per state size. In each
job every rank holds ``size`` bytes of state and has two checkpointers on the
same disk: a plain one (every save to disk) and one with
``PeerMemory(replication_factor=2)`` under /dev/shm (routine saves to peer
memory only). Then:

* **stall**: ``rounds`` routine ``save_async`` calls per checkpointer, the two
  alternating (which goes first alternates too); each figure is the time
  ``save_async`` blocked its caller (``info.stall_seconds``), after
  ``prepare(state)``, the previous save committed. The job's stall per round is
  the slowest rank's. The save time (call to commit, replication included) is
  reported beside it.
* **recovery**: node 1's area is deleted (its memory lost); every rank then
  calls ``load()`` on the peer checkpointer: ranks 0-1 read from their own
  node's area, ranks 2-3 receive their files from node 0 over gloo first. The
  plain checkpointer's ``load()`` reads the same step from the disk after its
  rank files were evicted from the page cache (``posix_fadvise DONTNEED`` on
  each clean file). Each recovery is the slowest rank's ``load()``, from the call
  to the verified state in hand; process restart and ``Checkpointer``
  construction (the same for both) are not counted. Both recoveries are run
  ``RECOVERIES`` times (node 1's area deleted again before each); the figure
  is their median.

Writes ``docs/benchmarks-peer-memory.md``. With ``--profile`` it writes nothing:
it runs one job per size with every rank's first recovery ``load()`` under cProfile
and prints the slowest rank's profile (the profiler's overhead makes those
times longer than the report's).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import multiprocessing as mp
import os
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mouthguard
from benchmarks.report import load_line, machine_line
from benchmarks.state import REPO, build_state, parse_size, size_label
from mouthguard.checkpoint.peer_memory import NodeArea
from mouthguard.tiers.local import LocalTier

DEFAULT_OUT = REPO / "docs" / "benchmarks-peer-memory.md"
WORLD = 4
#: Whole-job limit per size: a rank that hangs fails the run, never the machine.
JOB_TIMEOUT_SECONDS = 900.0
#: The issue's targets: recovery from peer memory vs the durable tier read cold,
#: and the stall with replication vs a plain async save.
TARGET_RECOVERY = 5.0
TARGET_STALL = 1.25
#: Recoveries per size (each from node 1's memory deleted, and from the disk
#: evicted); the figure is their median, each the slowest rank's.
RECOVERIES = 3
#: Functions of the profile printed with ``--profile`` (by cumulative time).
PROFILE_LINES = 30


def _evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (a cold read follows)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _rank(
    rank: int,
    port: int,
    root: str,
    shm: str,
    nbytes: int,
    rounds: int,
    profile: bool,
    results: Any,
) -> None:
    os.environ["GROUP_RANK"] = str(rank // 2)  # 2 nodes of 2
    timeout = dt.timedelta(seconds=JOB_TIMEOUT_SECONDS)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    try:
        results.put((rank, _job(rank, Path(root), Path(shm), nbytes, rounds, profile)))
    finally:
        dist.destroy_process_group()


def _job(
    rank: int, root: Path, shm: Path, nbytes: int, rounds: int, profile: bool
) -> dict[str, Any]:
    state = build_state(nbytes, seed=rank)
    disk = mouthguard.Store([LocalTier(root / "disk")])
    plain = mouthguard.Checkpointer(disk, run="plain", background=False)
    peers = mouthguard.Checkpointer(
        disk, run="peers", background=False, peers=mouthguard.PeerMemory(path=shm)
    )
    plain.prepare(state)
    peers.prepare(state)
    stall: dict[str, list[float]] = {"plain": [], "peers": []}
    save: dict[str, list[float]] = {"plain": [], "peers": []}
    for step in range(1, rounds + 1):
        order = [("plain", plain), ("peers", peers)]
        for name, ckpt in order if step % 2 else order[::-1]:
            info = ckpt.save_async(step, state).result(timeout=JOB_TIMEOUT_SECONDS)
            stall[name].append(float(info.stall_seconds or 0.0))
            save[name].append(float(info.save_seconds or 0.0))
    held = sum(h.nbytes for h in NodeArea(shm, f"node{rank // 2}").held("peers"))
    disk_seconds, peer_seconds, same, step = [], [], True, None
    profiled = ""
    for attempt in range(RECOVERIES):
        # Recovery from the disk, read cold.
        _evict(root / "disk" / "plain" / f"{rounds:012d}" / f"rank-{rank:05d}.safetensors")
        dist.barrier()
        started = time.perf_counter()
        from_disk = plain.load()
        disk_seconds.append(time.perf_counter() - started)
        # Recovery from peer memory after node 1 lost its memory (again: the
        # previous recovery gave it its files back).
        dist.barrier()
        if rank == 2:
            shutil.rmtree(shm / "node-node1")
        dist.barrier()
        profiler = cProfile.Profile() if profile and attempt == 0 else None
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        from_peers = peers.load()
        peer_seconds.append(time.perf_counter() - started)
        if profiler is not None:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(PROFILE_LINES)
            profiled = text.getvalue()
        same = same and all(
            torch.equal(from_peers.state[k], v) and torch.equal(from_disk.state[k], v)  # type: ignore[index]
            for k, v in state.items()
        )
        step = (from_peers.step, from_peers.tier)
        del from_disk, from_peers  # the next recovery starts from nothing held
    plain.close()
    peers.close()
    return {
        "stall": stall,
        "save": save,
        "disk_seconds": disk_seconds,
        "peer_seconds": peer_seconds,
        "peer_step": step,
        "same": same,
        "node_bytes": held,
        "profile": profiled,
    }


def run_size(
    nbytes: int, rounds: int, disk: Path, *, profile: bool = False
) -> list[dict[str, Any]]:
    """One 4-rank job at ``nbytes`` per rank, its disk under ``disk``; every rank's result."""
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
        procs = [
            ctx.Process(
                target=_rank,
                args=(r, server.port, root, shm, nbytes, rounds, profile, results),
            )
            for r in range(WORLD)
        ]
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


def _recoveries(ranks: list[dict[str, Any]], key: str) -> list[float]:
    """Per recovery, the slowest rank's time."""
    return [max(values) for values in zip(*(r[key] for r in ranks), strict=True)]


def _job_stalls(ranks: list[dict[str, Any]], key: str, name: str) -> list[float]:
    """Per round, the slowest rank's figure."""
    return [max(values) for values in zip(*(r[key][name] for r in ranks), strict=True)]


def report(sizes: list[int], rounds: int, out: Path, disk: Path) -> str:
    """Run every size and write the Markdown report; return it."""
    before = os.getloadavg()
    rows = []
    for nbytes in sizes:
        ranks = run_size(nbytes, rounds, disk)
        assert all(r["same"] and r["peer_step"] == (rounds, "peers") for r in ranks), ranks
        plain_stall = statistics.median(_job_stalls(ranks, "stall", "plain"))
        peer_stall = statistics.median(_job_stalls(ranks, "stall", "peers"))
        plain_save = statistics.median(_job_stalls(ranks, "save", "plain"))
        peer_save = statistics.median(_job_stalls(ranks, "save", "peers"))
        cold = statistics.median(_recoveries(ranks, "disk_seconds"))
        peer = statistics.median(_recoveries(ranks, "peer_seconds"))
        held = max(r["node_bytes"] for r in ranks) / 2  # 2 ranks per node
        rows.append((nbytes, cold, peer, plain_stall, peer_stall, plain_save, peer_save, held))
    after = os.getloadavg()
    lines = [
        "# Peer memory: recovery and save stall",
        "",
        "Generated by `python -m benchmarks.peer_memory` (what each figure counts: the",
        "module's docstring). 4 gloo ranks on loopback as 2 simulated nodes of 2, one",
        'machine: the "network" between nodes is loopback and every node\'s memory is',
        "this machine's /dev/shm, so transfers cost CPU and memory bandwidth, not a NIC.",
        f"Rounds per size: {rounds}; stall and save figures are medians over rounds of the",
        f"slowest rank; recovery is the median of {RECOVERIES} recoveries, each the slowest",
        "rank's `load()`.",
        "",
        machine_line(disk),
        load_line(before, after),
        "",
        "| state per rank | recovery: disk, cold | recovery: peer memory | speed-up "
        f"(target >= {TARGET_RECOVERY:g}x) | stall: plain async | stall: with peers | ratio "
        f"(target <= {TARGET_STALL:g}x) | save: plain | save: with peers | peer memory per rank |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nbytes, cold, peer, ps, qs, pv, qv, held in rows:
        speed, ratio = cold / peer, qs / ps if ps else float("inf")
        lines.append(
            f"| {size_label(nbytes)}iB | {cold:.3f} s | {peer:.3f} s | {speed:.1f}x "
            f"{'met' if speed >= TARGET_RECOVERY else 'not met'} | {ps * 1000:.1f} ms | "
            f"{qs * 1000:.1f} ms | {ratio:.2f}x {'met' if ratio <= TARGET_STALL else 'not met'} | "
            f"{pv:.3f} s | {qv:.3f} s | {held / 2**20:.0f} MiB |"
        )
    lines += [
        "",
        "* *recovery: disk, cold* -- `load()` of the plain run's newest step with each",
        "  rank file evicted from the page cache first; *peer memory* -- `load()` after",
        "  node 1's area was deleted: ranks 0-1 read their own node's copy, ranks 2-3",
        "  receive theirs from node 0 over gloo first. Both verify every byte.",
        "* *stall* -- the time `save_async` blocked (the snapshot into the staging",
        "  buffer); *save* -- call to commit: the plain save's disk write, or the peer",
        "  save's write to /dev/shm, the copy to the other node and the commit there",
        "  (the plain run's routine saves go to disk, the peer run's to memory only).",
        "* *peer memory per rank* -- bytes in one node's area after the last save",
        "  (its ranks' files and the copies it holds, `keep=2` steps), per rank.",
        "",
    ]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def main() -> None:
    """Parse the command line, run, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32M,128M", help="state per rank, comma separated")
    parser.add_argument("--rounds", type=int, default=5, help="saves per checkpointer")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--dir", type=Path, default=REPO, help="where the disk checkpoints go (a real disk)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print a profile of one recovery per size instead"
    )
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.profile:
        for nbytes in sizes:
            ranks = run_size(nbytes, args.rounds, args.dir, profile=True)
            slowest = max(ranks, key=lambda r: r["peer_seconds"][0])
            print(f"## {size_label(nbytes)}iB per rank: the slowest rank's recovery")
            print(slowest["profile"])
        return
    print(report(sizes, args.rounds, args.out, args.dir))


if __name__ == "__main__":
    main()
