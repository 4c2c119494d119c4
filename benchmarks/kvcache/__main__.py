"""Replay a Mooncake-format trace against KVStore and the naive one-file-per-block store.

    python -m benchmarks.kvcache                    # 4000 conversation requests, 16 KiB blocks
    python -m benchmarks.kvcache --profile chat     # the high-reuse chat trace
    python -m benchmarks.kvcache --quick --out /tmp/kv.md
    python -m benchmarks.kvcache --trace real.jsonl # a real Mooncake trace file
    python -m benchmarks.kvcache --lmcache-python /opt/lmcache-venv/bin/python  # + LMCache
    python -m benchmarks.kvcache --ram-budget-mib 96   # each store in a memory cgroup

With ``--ram-budget-mib`` every store replays in its own process, confined to a
memory cgroup of its start-up size plus that budget (``benchmarks/kvcache/cgroup.py``),
so the page cache cannot hold the blocks on disk and disk reads are disk reads.

Prints a markdown report (and writes it with --out). What each figure counts is in
docs/kvcache.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.kvcache import cgroup
from benchmarks.kvcache import trace as traces
from benchmarks.kvcache.naive import NaiveStore
from mouthguard.kvcache import KVStore

MiB = 1 << 20


def percentile_ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q) * 1e3:.3f}" if values else "-"


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def replay_kvstore(trace: list[traces.Request], root: Path, args: argparse.Namespace) -> dict:
    """Engine-style: a request reads its stored prefix, then puts the rest without waiting."""
    block = np.random.default_rng(0).integers(0, 256, args.block_kib * 1024, dtype=np.uint8)
    hits = total = 0
    put_seconds: list[float] = []
    started = time.perf_counter()
    with KVStore(
        disk_dir=root / "kvstore",
        memory_bytes=args.memory_mib * MiB,
        disk_bytes=args.disk_mib * MiB,
        block_tokens=1,  # one "token" per Mooncake block id: the ids are the chain
        namespace="bench",
        policy=args.policy,
        on_full=args.on_full,
    ) as kv:
        for r in trace:
            got = kv.get(r.hash_ids)
            hits += len(got)
            total += len(r.hash_ids)
            rest = len(r.hash_ids) - len(got)
            if rest:
                t0 = time.perf_counter()
                kv.put(r.hash_ids, [None] * len(got) + [block] * rest, wait=False)
                put_seconds.append(time.perf_counter() - t0)
        kv.flush()
        elapsed = time.perf_counter() - started
        stats = kv.stats()
    return {
        "hit_rate": hits / total,
        "stats": stats,
        "seconds": elapsed,
        "put_p50": percentile_ms(put_seconds, 50),
        "put_p99": percentile_ms(put_seconds, 99),
    }


def replay_naive(trace: list[traces.Request], root: Path, args: argparse.Namespace) -> dict:
    block = np.random.default_rng(0).integers(0, 256, args.block_kib * 1024, dtype=np.uint8)
    store = NaiveStore(root / "naive", (args.memory_mib + args.disk_mib) * MiB)
    hits = total = 0
    put_seconds: list[float] = []
    started = time.perf_counter()
    for r in trace:
        n = store.longest_prefix(r.hash_ids)
        store.get(r.hash_ids, n)
        hits += n
        total += len(r.hash_ids)
        if n < len(r.hash_ids):
            t0 = time.perf_counter()
            store.put(r.hash_ids, n, block)
            put_seconds.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    files = len(list((root / "naive").iterdir()))
    return {
        "hit_rate": hits / total,
        "seconds": elapsed,
        "p50": percentile_ms(store.latencies, 50),
        "p99": percentile_ms(store.latencies, 99),
        "gbps": store.read_bytes / sum(store.latencies) / 1e9 if store.latencies else None,
        "files": files,
        "put_p50": percentile_ms(put_seconds, 50),
        "put_p99": percentile_ms(put_seconds, 99),
    }


def dict_copy_p50_ms(block_kib: int, blocks: int = 2048, reads: int = 20000) -> float:
    """The floor for a memory get: a dictionary lookup plus one copy of a block.

    The copies of a request (32 blocks) are kept until it ends, as a caller keeps
    what ``get`` returns: a copy into memory that is freed at once lands in the
    same hot cache lines every time and would flatter the floor about 2.5x here.
    """
    rng = np.random.default_rng(1)
    table = {
        i.to_bytes(16, "little"): rng.integers(0, 256, block_kib * 1024, np.uint8)
        for i in range(blocks)
    }
    keys = list(table)
    order = rng.integers(0, blocks, reads)
    times = []
    kept: list[np.ndarray] = []
    for n, i in enumerate(order):
        if n % 32 == 0:
            kept = []
        t0 = time.perf_counter()
        kept.append(table[keys[i]].copy())
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 50) * 1e3)


def replay_confined(which: str, trace_path: Path, root: Path, args: argparse.Namespace) -> dict:
    """Run one store's replay in a child process inside a memory cgroup (see the docstring)."""
    out = root / f"{which}.json"
    command = [
        sys.executable, "-m", "benchmarks.kvcache", "--child", which,
        "--trace", str(trace_path), "--dir", str(root), "--child-out", str(out),
        "--block-kib", str(args.block_kib), "--memory-mib", str(args.memory_mib),
        "--disk-mib", str(args.disk_mib), "--policy", args.policy, "--on-full", args.on_full,
        "--ram-budget-mib", str(args.ram_budget_mib),
    ]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            _, stderr = child.communicate(timeout=3600)
        finally:
            child.kill()
            cgroup.release(f"mouthguard-kvbench-{child.pid}")  # the child's, now empty
    if child.returncode != 0 or not out.exists():
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{which} replay failed (exit {child.returncode}): {tail}")
    result: dict = json.loads(out.read_text())
    return result


def child(args: argparse.Namespace) -> int:
    """``--child``: one replay, confined, its result as JSON in ``--child-out``."""
    trace = traces.read(args.trace)
    root = Path(tempfile.mkdtemp(prefix=f"{args.child}-", dir=args.dir))
    name = f"mouthguard-kvbench-{os.getpid()}"
    why = cgroup.confine(name, args.ram_budget_mib * MiB)
    if why is not None:
        raise SystemExit(why)
    replay = replay_kvstore if args.child == "kvstore" else replay_naive
    result = replay(trace, root, args)
    shutil.rmtree(root, ignore_errors=True)
    args.child_out.write_text(json.dumps(result))
    return 0


def replay_lmcache(python: str, trace_path: Path, root: Path, args: argparse.Namespace) -> dict:
    """LMCache's local-disk backend in its own interpreter (``lmcache_peer.py``)."""
    peer = Path(__file__).with_name("lmcache_peer.py")
    directory = root / "lmcache"
    directory.mkdir()
    command = [
        python,
        str(peer),
        "--trace",
        str(trace_path),
        "--dir",
        str(directory),
        "--block-kib",
        str(args.block_kib),
        "--disk-mib",
        str(args.memory_mib + args.disk_mib),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    result: dict = json.loads(lines[-1])
    return result


def _ratio(a: str, b: str) -> str:
    try:
        return f"{float(a) / float(b):.2f}x"
    except (ValueError, ZeroDivisionError):
        return "-"


def _parser() -> argparse.ArgumentParser:
    """The command line (``--child`` and ``--child-out``: a confined replay's own)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kvcache")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--block-kib", type=int, default=16)
    parser.add_argument("--memory-mib", type=int, default=32)
    parser.add_argument("--disk-mib", type=int, default=384)
    parser.add_argument("--policy", default="lru", choices=["lru", "s3fifo"])
    parser.add_argument("--profile", default="conversation", choices=["conversation", "chat"])
    parser.add_argument(
        "--on-full", default="wait", choices=["wait", "drop"], help="KVStore's on_full option"
    )
    parser.add_argument(
        "--ram-budget-mib",
        type=int,
        help="run each store in a memory cgroup of its start-up size plus this (needs root)",
    )
    parser.add_argument("--child", choices=["kvstore", "naive"], help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trace", type=Path, help="a Mooncake-format JSONL trace to replay")
    parser.add_argument("--dir", type=Path, help="where the stores write (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="write the markdown report here too")
    parser.add_argument("--quick", action="store_true", help="200 requests, 32 KiB blocks")
    parser.add_argument(
        "--lmcache-python", help="an interpreter with lmcache installed: adds LMCache's row"
    )
    return parser


def _load_trace(args: argparse.Namespace, root: Path) -> tuple[list[traces.Request], Path, str]:
    """The trace to replay, the Mooncake-format file it is read from, and its description.

    A synthetic trace is written under ``root`` and read back, as a real trace would be.
    """
    if args.trace is not None:
        path = args.trace
        trace = traces.read(path)
        source = f"`{args.trace}` (Mooncake format)"
    elif args.profile == "chat":
        trace = traces.synthetic(args.requests)
        path = root / "synthetic-mooncake.jsonl"
        traces.write(path, trace)
        trace = traces.read(path)  # replayed from the file, as a real trace would be
        source = "synthetic multi-round chat, Zipf-shared prefixes, Mooncake format"
    else:
        trace = traces.conversation(args.requests)
        path = root / "conversation-mooncake.jsonl"
        traces.write(path, trace)
        trace = traces.read(path)
        source = (
            "synthetic, shaped after Mooncake's conversation trace (low reuse), Mooncake format"
        )
    return trace, path, source


def _report_header(
    args: argparse.Namespace,
    argv: list[str] | None,
    trace: list[traces.Request],
    source: str,
    loads: tuple[float, float],
) -> list[str]:
    """What was replayed, where and how, and the table's heading."""
    load_start, load_end = loads
    blocks = sum(len(r.hash_ids) for r in trace)
    return [
        "# KV-cache benchmark",
        "",
        f"- trace: {source}; {len(trace)} requests, {blocks} block reads requested",
        f"- block payload {args.block_kib} KiB (Mooncake blocks are 512 tokens; scaled down),"
        f" memory {args.memory_mib} MiB, disk {args.disk_mib} MiB, policy {args.policy}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        f"- load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}",
        "- page cache: "
        + (
            f"each store in its own memory cgroup, start-up size + {args.ram_budget_mib} MiB"
            " (RAM tier, staging and page cache together)"
            if args.ram_budget_mib
            else "free (this machine's spare RAM can hold every file)"
        ),
        f"- command: `python -m benchmarks.kvcache {' '.join(argv or sys.argv[1:])}`",
        "",
        "| store | block hit rate | ideal LRU (same capacity) | tier | get p50 ms | get p99 ms |"
        " read GB/s | put p50 ms | put p99 ms | replay s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]


def _report_rows(mine: dict, naive: dict, peer: dict | None, ideal: float) -> list[str]:
    """One row per KVStore tier, the naive store's, and LMCache's (or why it is missing)."""
    stats = mine["stats"]
    lines = []
    for tier in ("memory", "disk"):
        t = stats[tier]
        lines.append(
            f"| mouthguard KVStore | {mine['hit_rate']:.3f} | {ideal:.3f} | {tier} |"
            f" {fmt(t['get_p50_ms'])} | {fmt(t['get_p99_ms'])} | {fmt(t['read_gbps'], 2)} |"
            f" {mine['put_p50']} | {mine['put_p99']} | {mine['seconds']:.1f} |"
        )
    lines.append(
        f"| naive file per block | {naive['hit_rate']:.3f} | {ideal:.3f} | disk |"
        f" {naive['p50']} | {naive['p99']} | {fmt(naive['gbps'], 2)} |"
        f" {naive['put_p50']} | {naive['put_p99']} | {naive['seconds']:.1f} |"
    )
    if peer is None:
        lines.append("| LMCache local disk | not run (no --lmcache-python) | | | | | | | | |")
    elif "error" in peer:
        lines.append(f"| LMCache local disk | failed: {peer['error']} | | | | | | | | |")
    else:
        lines.append(
            f"| LMCache {peer['version']} local disk | {peer['hit_rate']:.3f} | {ideal:.3f} |"
            f" disk (page cache free) | {fmt(peer['p50_ms'])} | {fmt(peer['p99_ms'])} |"
            f" {fmt(peer['gbps'], 2)} | | | {peer['seconds']:.1f} |"
        )
    return lines


def _report_notes(
    mine: dict, naive: dict, peer: dict | None, floor: float, ideal: float
) -> list[str]:
    """The ratios against the targets, KVStore's staging and its tiers' contents."""
    stats = mine["stats"]
    store = stats["store"]
    lines = [
        "",
        f"Ratios: replay time KVStore / naive {mine['seconds'] / naive['seconds']:.2f}"
        f" (target <= 1); hit rate / ideal LRU {mine['hit_rate'] / ideal:.3f} (target >= 0.95);"
        f" memory get p50 {fmt(stats['memory']['get_p50_ms'])} ms against a dictionary lookup"
        f" plus copy of the same block, {floor:.4f} ms:"
        f" {(stats['memory']['get_p50_ms'] or 0) / floor:.2f}x (target <= 2);"
        f" put p99 against the naive store's {_ratio(mine['put_p99'], naive['put_p99'])}"
        " (target <= 2)."
        + (
            f" Against LMCache: replay {mine['seconds'] / peer['seconds']:.2f}x its time."
            if peer and "seconds" in peer
            else ""
        ),
        f"KVStore staging: peak {store['staging_peak']} B of {store['staging_capacity']} B"
        f" allowed, {store['dropped']} puts dropped (on_full={store['on_full']}).",
    ]
    lines += [
        "",
        f"KVStore: memory {stats['memory']['bytes']} / {stats['memory']['capacity']} B,"
        f" disk {stats['disk']['bytes']} / {stats['disk']['capacity']} B in"
        f" {stats['disk']['segments']} segment files; evictions memory"
        f" {stats['memory']['evictions']}, disk {stats['disk']['evictions']}; corrupt"
        f" {stats['disk']['corrupt']}. Naive: {naive['files']} files."
        + (
            f" LMCache: {peer['files']} files, {peer['disk_bytes']} B."
            if peer and "files" in peer
            else ""
        ),
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.requests, args.block_kib, args.memory_mib, args.disk_mib = 200, 32, 2, 16
    load_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="kvbench-", dir=args.dir))
    try:
        trace, path, source = _load_trace(args, root)
        capacity_blocks = (args.memory_mib + args.disk_mib) * MiB // (args.block_kib * 1024)
        ideal = traces.ideal_lru_hit_rate(trace, capacity_blocks)
        if args.ram_budget_mib:
            mine = replay_confined("kvstore", path, root, args)
            naive = replay_confined("naive", path, root, args)
        else:
            mine = replay_kvstore(trace, root, args)
            naive = replay_naive(trace, root, args)
        floor = dict_copy_p50_ms(args.block_kib)
        peer = None
        if args.lmcache_python:
            peer = replay_lmcache(args.lmcache_python, path, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_end = os.getloadavg()
    lines = _report_header(args, argv, trace, source, (load_start, load_end))
    lines += _report_rows(mine, naive, peer, ideal)
    lines += _report_notes(mine, naive, peer, floor, ideal)
    report = "\n".join(lines)
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
