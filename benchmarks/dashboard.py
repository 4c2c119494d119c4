"""The dashboard with many checkpoints: how long the store read takes, and how fast pages are.

    .venv/bin/python -m benchmarks.dashboard                      # 10,000 checkpoints (~2 min here)
    .venv/bin/python -m benchmarks.dashboard --checkpoints 200    # a smoke run

Builds a store of ``--checkpoints`` tiny checkpoints (10 runs; every 10th save
milestone, every 100th critical; half the runs replicated and read back, so
protected and unprotected ones mix; a hold on every 50th), then measures:

* the snapshot: reading every manifest and sidecar of every copy and judging
  them (``take_snapshot``), median of ``--repeats``; and the process's peak RSS;
* every route the page uses, served by uvicorn on loopback from the cached
  snapshot: median and 95th percentile of ``--requests`` sequential requests
  (urllib, a new connection each), and the response's size;
* the page in headless chromium: wall time from launching the browser until it
  dumps the DOM with every fetch done (``--virtual-time-budget``), for this store
  and for a store of 10 checkpoints, whose difference is what the data costs
  (browser start-up is in both).

Checkpoints are 16-float states: the figures measure the number of checkpoints
and copies, not their bytes (the dashboard never reads tensor bytes). Prints a
markdown report (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

import mouthguard
from mouthguard.dashboard import DashboardThread, SnapshotCache, create_app
from mouthguard.dashboard.snapshot import take_snapshot
from mouthguard.jobs.replicator import Replicator

RUNS = 10
ROUTES = (
    "/",
    "/api/summary",
    "/api/checkpoints?limit=100",
    "/api/checkpoints?run=run-00&limit=500",
    "/api/timeline",
    "/api/pending",
    "/metrics",
)


def build(root: Path, checkpoints: int, console: Console) -> mouthguard.Store:
    """A store of ``checkpoints`` tiny checkpoints over :data:`RUNS` runs (module docstring)."""
    store = mouthguard.open_store(root)
    state = {"w": torch.ones(16)}
    per_run = max(1, checkpoints // RUNS)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("saving", total=per_run * RUNS)
        for r in range(RUNS):
            ckpt = mouthguard.Checkpointer(store, f"run-{r:02d}", background=False)
            for step in range(1, per_run + 1):
                level = (
                    "critical" if step % 100 == 0 else "milestone" if step % 10 == 0 else "routine"
                )
                ckpt.save(step, state, importance=level)
                if step % 50 == 0:
                    ckpt.hold(step, "audit")
                progress.advance(task)
        task = progress.add_task("replicating half the runs", total=RUNS // 2)
        for r in range(RUNS // 2):
            Replicator(store).run_once([f"run-{r:02d}"])
            progress.advance(task)
    return store


def time_snapshot(store: mouthguard.Store, repeats: int) -> tuple[float, int, int]:
    """Median seconds of ``take_snapshot``, its rows and pending actions."""
    seconds, rows, pending = [], 0, 0
    for _ in range(repeats):
        started = time.perf_counter()
        snapshot = take_snapshot(
            store, now=lambda: dt.datetime.now(dt.UTC), monotonic=time.monotonic
        )
        seconds.append(time.perf_counter() - started)
        rows, pending = len(snapshot.rows), len(snapshot.pending)
    return statistics.median(seconds), rows, pending


def time_routes(url: str, requests: int) -> list[tuple[str, float, float, int]]:
    """Per route: median and p95 seconds over ``requests`` GETs, and the body's bytes."""
    results = []
    for route in ROUTES:
        seconds, size = [], 0
        for _ in range(requests):
            started = time.perf_counter()
            with urllib.request.urlopen(url + route, timeout=120) as response:
                size = len(response.read())
            seconds.append(time.perf_counter() - started)
        seconds.sort()
        p95 = seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))]
        results.append((route, statistics.median(seconds), p95, size))
    return results


def time_browser(url: str, profile: Path) -> float | None:
    """Seconds from launching headless chromium until its DOM dump (None: no chromium)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
        "--dump-dom",
        url + "/",
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    elapsed = time.perf_counter() - started
    if 'data-loaded="true"' not in result.stdout:
        raise RuntimeError("the page did not finish loading in chromium")
    return elapsed


def serve(store: mouthguard.Store) -> tuple[DashboardThread, SnapshotCache]:
    cache = SnapshotCache(store, max_age=3600.0)  # warm for the whole measurement
    cache.refresh()
    return DashboardThread(create_app(cache)).start(), cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard")
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="snapshot reads (median)")
    parser.add_argument("--requests", type=int, default=20, help="GETs per route")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        store = build(root / "big", args.checkpoints, console)
        built = time.perf_counter() - started
        console.print(f"built {args.checkpoints} checkpoints in {built:.0f} s")
        snapshot_seconds, rows, pending = time_snapshot(store, args.repeats)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        thread, _ = serve(store)
        try:
            routes = time_routes(thread.address.url, args.requests)
            page = time_browser(thread.address.url, root / "profile-big")
        finally:
            thread.stop()
        small = build(root / "small", RUNS, console)  # one checkpoint per run
        small_thread, _ = serve(small)
        try:
            baseline = time_browser(small_thread.address.url, root / "profile-small")
        finally:
            small_thread.stop()
    report = _report(args, rows, pending, snapshot_seconds, rss_mib, routes, page, baseline)
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


def _report(
    args: argparse.Namespace,
    rows: int,
    pending: int,
    snapshot_seconds: float,
    rss_mib: float,
    routes: list[tuple[str, float, float, int]],
    page: float | None,
    baseline: float | None,
) -> str:
    lines = [
        f"Store: {rows} checkpoints in {RUNS} runs, {pending} pending retention actions.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average at end {os.getloadavg()[0]:.2f}.",
        f"Command: `python -m benchmarks.dashboard --checkpoints {args.checkpoints}`",
        "",
        "| what | median | p95 | bytes |",
        "|---|---:|---:|---:|",
        f"| snapshot: read and judge the whole store ({args.repeats} reads) "
        f"| {snapshot_seconds:.2f} s | | |",
    ]
    for route, median, p95, size in routes:
        lines.append(f"| GET `{route}` | {median * 1000:.1f} ms | {p95 * 1000:.1f} ms | {size} |")
    if page is not None and baseline is not None:
        lines.append(f"| chromium: launch to complete page, this store | {page:.2f} s | | |")
        lines.append(
            f"| chromium: launch to complete page, {RUNS} checkpoints | {baseline:.2f} s | | |"
        )
    else:
        lines.append("| chromium | not installed | | |")
    lines.append(f"| peak RSS of the benchmark process | {rss_mib:.0f} MiB | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
