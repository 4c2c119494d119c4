"""Where one reader's time goes: ``python -m benchmarks.data.profile``.

Writes the same samples in each named reader's format (:mod:`benchmarks.data.writers`)
into a temp dir on the local disk, then runs each reader's cell with no DataLoader
workers by default (direct iteration: every sample is produced in the process
that is profiled; ``--workers N`` for N, whose own work the profile then does
not see) in a fresh process, a cold epoch and a warm one as in
:mod:`benchmarks.data.child`, and prints each epoch's samples/s and the top
functions by own time of a ``cProfile`` enabled during the epochs only (cold
and warm together; imports and building the loader not included; the epoch's
``gc.collect()`` before its clock starts is). The page cache is not dropped:
"cold" is the loader's first epoch. ``cProfile`` sees the iterating thread only:
time a reader spends in threads of its own (mouthguard's prefetch and range
reads, hashing) shows there as waits (``acquire`` of a lock).
The profiler's own cost (every Python call is counted) slows every reader, so
compare the lines' shares, not their absolute times, with an unprofiled run.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from benchmarks.data import readers, writers
from benchmarks.data.child import MARK, STATES, run_epoch
from benchmarks.data.config import Cell, CellResult
from benchmarks.state import parse_size


def profile_reader(reader: str, root: Path, args: argparse.Namespace) -> None:
    """Run ``reader``'s cell under cProfile; print its figures and top lines."""
    count = args.size // args.sample_size
    cell = Cell(
        reader,
        "local",
        args.workers,
        "throughput",
        str(root),
        count,
        args.sample_size,
        32,
        0.0,
        False,
    )
    out = root / f"{reader}.prof"
    command = [sys.executable, "-m", "benchmarks.data.profile", "--cell", cell.to_json(), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith(MARK))
    result = CellResult.from_json(line[len(MARK) :])
    print(f"\n### {reader}: {count} samples of {args.sample_size} B, {args.workers} workers, local")
    print(f"load before: {os.getloadavg()[0]:.1f}")
    for epoch in result.epochs:
        print(
            f"{epoch.state}: {epoch.samples / epoch.seconds:.0f} samples/s in {epoch.seconds:.2f} s"
        )
    stats = pstats.Stats(str(out))
    print(f"profile: {stats.total_tt:.2f} s of profiled time")  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(args.top)


def profile_cell(cell: Cell, out: Path) -> None:
    """In the fresh process: build the loader, profile its epochs into ``out``, print the result."""
    warnings.filterwarnings("ignore")
    result = CellResult(cell.reader, cell.source, cell.workers, cell.mode)
    loader = readers.build(cell)
    profiler = cProfile.Profile()
    for state in STATES:
        profiler.enable()
        try:
            result.epochs.append(run_epoch(cell, loader, state))
        finally:
            profiler.disable()
    profiler.dump_stats(out)
    print(MARK + result.to_json(), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--cell"]:
        profile_cell(Cell.from_json(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", default="mouthguard,litdata,webdataset")
    parser.add_argument("--size", type=parse_size, default=parse_size("128M"))
    parser.add_argument("--sample-size", type=parse_size, default=parse_size("100K"))
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("16M"))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--workers", type=int, default=0, help="DataLoader workers (their work is not profiled)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=".mouthguard-data-profile-"))
    try:
        for reader in args.readers.split(","):
            count = args.size // args.sample_size
            writers.write(reader, root, count, args.sample_size, args.shard_size)
            profile_reader(reader, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
