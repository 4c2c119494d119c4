"""The peer-memory benchmark's Markdown report (what each figure counts: the package docstring)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.peer_memory import RECOVERIES, TARGET_RECOVERY, TARGET_STALL
from benchmarks.peer_memory.launch import S3Target, run_size
from benchmarks.report import load_line, machine_line
from benchmarks.state import size_label


@dataclass(frozen=True)
class Row:
    """One size's figures: recoveries (s, ``s3`` None when not run), stalls and saves (s)."""

    nbytes: int
    cold: float
    s3: float | None
    peer: float
    plain_stall: float
    peer_stall: float
    plain_save: float
    peer_save: float
    held_per_rank: float
    #: With a profile: the slowest rank's cProfile lines of its profiled recovery, per source.
    profiles: dict[str, str] = field(default_factory=dict)


def _recoveries(ranks: list[dict[str, Any]], source: str) -> list[float]:
    """Per recovery from ``source``, the slowest rank's time."""
    return [max(values) for values in zip(*(r["seconds"][source] for r in ranks), strict=True)]


def _rounds(ranks: list[dict[str, Any]], key: str, name: str) -> list[float]:
    """Per round, the slowest rank's figure."""
    return [max(values) for values in zip(*(r[key][name] for r in ranks), strict=True)]


def check_recoveries(ranks: list[dict[str, Any]], rounds: int) -> None:
    """Every rank's every recovery loaded the saved state of the newest step from its source.

    A peer recovery that fell back to the store would time the store, not peer
    memory: that is an error here, naming what each recovery loaded from.
    """
    expected = {"disk": (rounds, "local"), "peers": (rounds, "peers"), "s3": (rounds, "s3")}
    for r in ranks:
        assert r["same"], "a recovery loaded something else than was saved"
        loaded = r["tiers"].items()
        assert all(got == expected[source] for source, each in loaded for got in each), loaded


def measure(nbytes: int, rounds: int, disk: Path, s3: S3Target, *, profile: bool = False) -> Row:
    """Run one size's job, check every recovery loaded the saved state, and summarise it.

    ``profile``: also profile one extra peer-memory and S3 recovery (not in the figures).
    """
    ranks = run_size(nbytes, rounds, disk, s3, profile=profile)
    check_recoveries(ranks, rounds)
    profiles = {
        source: max(ranks, key=lambda r: r["profiled_seconds"][source])["profiles"][source]
        for source in ranks[0]["profiles"]
    }
    return Row(
        nbytes,
        statistics.median(_recoveries(ranks, "disk")),
        statistics.median(_recoveries(ranks, "s3")) if s3.options is not None else None,
        statistics.median(_recoveries(ranks, "peers")),
        statistics.median(_rounds(ranks, "stall", "plain")),
        statistics.median(_rounds(ranks, "stall", "peers")),
        statistics.median(_rounds(ranks, "save", "plain")),
        statistics.median(_rounds(ranks, "save", "peers")),
        max(r["node_bytes"] for r in ranks) / 2,  # 2 ranks per node
        profiles,
    )


def _speedup(durable: float | None, peer: float) -> str:
    if durable is None:
        return "not run"
    speed = durable / peer
    return f"{speed:.1f}x {'met' if speed >= TARGET_RECOVERY else 'not met'}"


def _line(row: Row) -> str:
    ratio = row.peer_stall / row.plain_stall if row.plain_stall else float("inf")
    s3 = "not run" if row.s3 is None else f"{row.s3:.3f} s"
    return (
        f"| {size_label(row.nbytes)}iB | {row.cold:.3f} s | {s3} | {row.peer:.3f} s | "
        f"{_speedup(row.cold, row.peer)} | {_speedup(row.s3, row.peer)} | "
        f"{row.plain_stall * 1000:.1f} ms | {row.peer_stall * 1000:.1f} ms | "
        f"{ratio:.2f}x {'met' if ratio <= TARGET_STALL else 'not met'} | "
        f"{row.plain_save:.3f} s | {row.peer_save:.3f} s | {row.held_per_rank / 2**20:.0f} MiB |"
    )


_NOTES = [
    "* *recovery: disk, cold* -- `load()` of the plain run's newest step with each",
    "  rank file evicted from the page cache first; *S3* -- `load()` of the same",
    "  state from a store whose only tier is S3 (Ceph RGW on 127.0.0.1, one memstore",
    "  OSD: the objects are in the OSD's RAM, so this is loopback HTTP plus RGW's and",
    "  the OSD's CPU, on the same 2 CPUs as the ranks, never a disk); *peer memory*",
    "  -- `load()` after node 1's area was deleted: ranks 0-1 read their own node's",
    "  copy, ranks 2-3 receive theirs from node 0 over gloo first. All three verify",
    "  every byte, and every loaded state was compared with the saved one.",
    "* *speed-up* -- the durable tier's recovery over peer memory's.",
    "* *stall* -- the time `save_async` blocked (the snapshot into the staging",
    "  buffer); *save* -- call to commit: the plain save's disk write, or the peer",
    "  save's write to /dev/shm, the copy to the other node and the commit there",
    "  (the plain run's routine saves go to disk, the peer run's to memory only).",
    "* *peer memory per rank* -- bytes in one node's area after the last save",
    "  (its ranks' files and the copies it holds, `keep=2` steps), per rank.",
    "",
]


def report(
    sizes: list[int],
    rounds: int,
    out: Path | None,
    disk: Path,
    s3: S3Target,
    *,
    profile: bool = False,
) -> tuple[str, list[Row]]:
    """Run every size and write the Markdown report to ``out`` (None: nowhere).

    Returns the report and each size's row.

    ``profile``: each row also holds the profiles of one extra recovery per source
    (:func:`measure`), which the report's figures do not count.
    """
    before = os.getloadavg()
    rows = [measure(nbytes, rounds, disk, s3, profile=profile) for nbytes in sizes]
    after = os.getloadavg()
    server = f"S3: Ceph RGW {s3.version}." if s3.options else f"S3 not run: {s3.why_not}."
    lines = [
        "# Peer memory: recovery and save stall",
        "",
        "Generated by `python -m benchmarks.peer_memory` (what each figure counts: the",
        "package's docstring). 4 gloo ranks on loopback as 2 simulated nodes of 2, one",
        'machine: the "network" between nodes is loopback and every node\'s memory is',
        "this machine's /dev/shm, so transfers cost CPU and memory bandwidth, not a NIC.",
        f"Rounds per size: {rounds}; stall and save figures are medians over rounds of the",
        f"slowest rank; recovery is the median of {RECOVERIES} recoveries, each the slowest",
        "rank's `load()`. The machine is shared with other work: the load average below",
        "says how much.",
        "",
        machine_line(disk),
        server,
        load_line(before, after),
        "",
        "| state per rank | recovery: disk, cold | recovery: S3 | recovery: peer memory | "
        f"speed-up vs disk (target >= {TARGET_RECOVERY:g}x) | speed-up vs S3 (target >= "
        f"{TARGET_RECOVERY:g}x) | stall: plain async | stall: with peers | ratio (target <= "
        f"{TARGET_STALL:g}x) | save: plain | save: with peers | peer memory per rank |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_line(row) for row in rows),
        "",
        *_NOTES,
    ]
    text = "\n".join(lines)
    if out is not None:
        out.write_text(text)
    return text, rows
