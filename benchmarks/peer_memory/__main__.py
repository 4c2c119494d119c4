"""``python -m benchmarks.peer_memory``: run, write and print the report (and profiles)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.peer_memory import DEFAULT_OUT
from benchmarks.peer_memory import __doc__ as about
from benchmarks.peer_memory.launch import S3Target, s3_target
from benchmarks.peer_memory.report import Row, report
from benchmarks.state import REPO, parse_size, size_label


def _print_profiles(rows: list[Row], s3: S3Target) -> None:
    """Print, per size, the slowest rank's profile of its extra peer and S3 recovery."""
    names = {"peers": "peer-memory", "s3": "S3"}
    for row in rows:
        for source, name in names.items():
            label = f"{size_label(row.nbytes)}iB per rank"
            if source not in row.profiles:
                print(f"## {label}: no {name} recovery ({s3.why_not})\n")
                continue
            print(f"## {label}: the slowest rank's {name} recovery")
            print(row.profiles[source])


def main() -> None:
    """Parse the command line, run, print the report."""
    assert about is not None
    parser = argparse.ArgumentParser(description=about.splitlines()[0])
    parser.add_argument("--sizes", default="32M,256M", help="state per rank, comma separated")
    parser.add_argument("--rounds", type=int, default=5, help="saves per checkpointer")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"where the report goes (default {DEFAULT_OUT.relative_to(REPO)}; "
        "with --profile, only printed unless given)",
    )
    parser.add_argument(
        "--dir", type=Path, default=REPO, help="where the disk checkpoints go (a real disk)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print profiles of one extra peer and S3 recovery per size (not in the figures)",
    )
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    # A profile run is a diagnosis, with a profiler slowing its ranks beside the timed
    # recoveries: it replaces the generated page only when asked to (--out).
    out = args.out if args.out is not None or args.profile else DEFAULT_OUT
    with s3_target() as s3:
        text, rows = report(sizes, args.rounds, out, args.dir, s3, profile=args.profile)
    print(text)
    if args.profile:
        _print_profiles(rows, s3)


if __name__ == "__main__":
    main()
