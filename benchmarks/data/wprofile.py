"""Where a DataLoader worker's time goes: ``python -m benchmarks.data.wprofile``.

:mod:`benchmarks.data.profile` profiles the process that iterates the loader, which
sees none of its workers' work. This profiles inside the workers, on the local
disk or on the benchmark's S3 server (:mod:`benchmarks.data.s3`, optionally behind
its latency proxy): each named reader's dataset is written (and uploaded), then
its cell (:mod:`benchmarks.data.child`: a cold epoch, then a warm one, with
``--workers`` DataLoader workers) runs in a fresh process in which

* every worker runs ``cProfile`` from its ``worker_init_fn`` until it exits (its
  main thread only: the reader's own threads show as waits), dumped per worker;
* a timeline records, on the system-wide monotonic clock, when each epoch's
  ``iter()`` was called, when each worker's ``worker_init_fn`` ran and when it
  finished each batch (the benchmark's collate function, wrapped).

It prints, per reader and epoch, each worker's milliseconds from ``iter()`` to its
start (the fork or fork server, unpickling the dataset, torch's worker setup) and
to its first and last batch, then the top functions by own time of the
workers' profiles, cold and warm apart. The page cache is not dropped ("cold"
is the loader's first epoch; its cache directory starts empty). The profiler
slows the workers (every Python call counted): compare shares and the
timeline, not absolute times, with an unprofiled run.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import util
from pathlib import Path
from typing import Any

from benchmarks.data import config, s3
from benchmarks.data.child import MARK, STATES, run_epoch
from benchmarks.data.config import Cell, Site
from benchmarks.state import parse_size

#: Where a cell's workers write their profiles and timeline (set by the parent).
_OUT = "BENCH_WPROFILE_OUT"
REPO = Path(__file__).resolve().parents[2]


def _log(event: str, **fields: object) -> None:
    """One line of the timeline (appends are atomic at this size: one write each)."""
    line = json.dumps({"t": time.monotonic(), "pid": os.getpid(), "ev": event, **fields})
    with Path(os.environ[_OUT], "timeline.jsonl").open("a") as f:
        f.write(line + "\n")


def _dump(profiler: cProfile.Profile, path: str) -> None:
    profiler.disable()
    profiler.dump_stats(path)


def worker_init(worker_id: int, inner: Callable[[int], None] | None = None) -> None:
    """A worker's start: log it, profile it until it exits (multiprocessing's finalizers)."""
    _log("init", worker=worker_id)
    profiler = cProfile.Profile()
    profiler.enable()
    path = str(Path(os.environ[_OUT], f"w{worker_id}-{os.getpid()}.prof"))
    util.Finalize(None, _dump, args=(profiler, path), exitpriority=100)
    if inner is not None:
        inner(worker_id)


def collate(items: Any, inner: Callable[[Any], Any]) -> Any:
    """The benchmark's collate, then a timeline entry for the batch."""
    out = inner(items)
    _log("batch")
    return out


def run_cell(cell: Cell) -> None:
    """In the fresh process: build the loader, hook its workers, run the epochs."""
    from benchmarks.data import readers  # noqa: PLC0415 - the readers' imports here only

    warnings.filterwarnings("ignore")
    loader: Any = readers.build(cell)
    loader.worker_init_fn = functools.partial(worker_init, inner=loader.worker_init_fn)
    loader.collate_fn = functools.partial(collate, inner=loader.collate_fn)
    for state in STATES:
        _log("epoch", state=state)
        epoch = run_epoch(cell, loader, state)
        _log("end", state=state, seconds=epoch.seconds, samples=epoch.samples)
    print(MARK, flush=True)


def timeline(out: Path) -> dict[str, list[int]]:
    """Print each epoch's workers: ms to their start, first and last batch; pids by epoch."""
    events = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    marks = [e for e in events if e["ev"] == "epoch"] + [{"t": float("inf")}]
    pids: dict[str, list[int]] = {}
    for mark, following in itertools.pairwise(marks):
        t0 = mark["t"]
        inside = [e for e in events if t0 <= e["t"] < following["t"]]
        end = next(e for e in inside if e["ev"] == "end")
        rate = end["samples"] / end["seconds"]
        print(f"  {mark['state']}: {rate:.0f} samples/s, epoch {end['seconds']:.3f} s")
        starts = {e["pid"]: e["t"] - t0 for e in inside if e["ev"] == "init"}
        pids[mark["state"]] = sorted(starts)
        for pid in sorted(starts, key=starts.__getitem__):
            done = [e["t"] - t0 for e in inside if e["ev"] == "batch" and e["pid"] == pid]
            first, last = (min(done), max(done)) if done else (float("nan"),) * 2
            print(
                f"    worker pid {pid}: started {starts[pid] * 1000:.0f} ms, first batch "
                f"{first * 1000:.0f} ms, last {last * 1000:.0f} ms ({len(done)} batches)"
            )
    return pids


def profile_reader(reader: str, root: Path, site: Site | None, args: argparse.Namespace) -> None:
    """Run ``reader``'s cell with its workers profiled; print the timeline and the top lines."""
    count = args.size // args.sample_size
    source = "local" if site is None else "s3"
    cell = Cell(
        reader, source, args.workers, "throughput", str(root), count, args.sample_size, 32, 0.0,
        False, site=site, persistent=args.persistent_workers,
    )  # fmt: skip
    out = root / f"profile-{reader}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    shutil.rmtree(config.cache_dir(root, reader, source), ignore_errors=True)
    env = {**os.environ, _OUT: str(out), "MOUTHGUARD_VERIFIED_DIR": str(out / "verified")}
    command = [sys.executable, "-m", "benchmarks.data.wprofile", "--cell", cell.to_json()]
    subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    print(f"\n### {reader}: {count} samples of {args.sample_size} B, {args.workers} workers, "
          f"{source}; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    pids = timeline(out)
    for state, members in pids.items():
        files = [str(p) for pid in members for p in out.glob(f"w*-{pid}.prof")]
        if not files:
            continue
        stats = pstats.Stats(*files)
        stats.files = []  # type: ignore[attr-defined]  # not a line per worker's file
        total = stats.total_tt  # type: ignore[attr-defined]
        print(f"\n{state} epoch, {len(files)} workers' main threads: {total:.2f} s profiled")
        stats.sort_stats("tottime").print_stats(args.top)


@contextmanager
def serving(args: argparse.Namespace) -> Iterator[tuple[Site | None, dict[str, str]]]:
    """No server for local; else the benchmark's RGW (behind the latency proxy if asked)."""
    if args.source == "local":
        yield None, {}
        return
    with s3.Server() as server, s3.delayed(server, args.s3_latency_ms / 1000) as route:
        yield route.site, route.env


def main() -> None:
    if sys.argv[1:2] == ["--cell"]:
        run_cell(Cell.from_json(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", default="webdataset,litdata,mouthguard")
    parser.add_argument("--source", choices=config.SOURCES, default="s3")
    parser.add_argument("--size", type=parse_size, default=parse_size("128M"))
    parser.add_argument("--sample-size", type=parse_size, default=parse_size("100K"))
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("16M"))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--persistent-workers", action="store_true")
    parser.add_argument("--s3-latency-ms", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=".mouthguard-data-wprofile-"))
    count = args.size // args.sample_size
    try:
        with serving(args) as (site, env):
            os.environ.update(env)  # the cells' children inherit the server's settings
            for reader in args.readers.split(","):
                for step in ("raw", reader) if reader == config.MOUTHGUARD else (reader,):
                    sizes = [str(count), str(args.sample_size), str(args.shard_size)]
                    _child(["write", step, str(root), *sizes])
                if site is not None:
                    _child(["upload", reader, str(root), _site_json(site), str(args.shard_size)])
                profile_reader(reader, root, site, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _child(argv: list[str]) -> None:
    """A write or upload in a child process (litdata's writer switches to ``spawn``)."""
    command = [sys.executable, "-m", "benchmarks.data.child", *argv]
    subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)


def _site_json(site: Site) -> str:
    return json.dumps({"endpoint": site.endpoint, "bucket": site.bucket, "log": site.log})


if __name__ == "__main__":
    main()
