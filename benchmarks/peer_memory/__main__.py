"""``python -m benchmarks.peer_memory``: run, write and print the report (or ``--profile``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.peer_memory import DEFAULT_OUT
from benchmarks.peer_memory import __doc__ as about
from benchmarks.peer_memory.launch import S3Target, run_size, s3_target
from benchmarks.peer_memory.report import check_recoveries, report
from benchmarks.state import REPO, parse_size, size_label


def _profile(sizes: list[int], rounds: int, disk: Path, s3: S3Target) -> None:
    """Print, per size, the slowest rank's profile of its first peer and S3 recovery."""
    names = {"peers": "peer-memory", "s3": "S3"}
    for nbytes in sizes:
        ranks = run_size(nbytes, rounds, disk, s3, profile=True)
        check_recoveries(ranks, rounds)
        for source, name in names.items():
            if source not in ranks[0]["profiles"]:
                print(f"## {size_label(nbytes)}iB per rank: no {name} recovery ({s3.why_not})\n")
                continue
            slowest = max(ranks, key=lambda r: r["seconds"][source][0])
            print(f"## {size_label(nbytes)}iB per rank: the slowest rank's {name} recovery")
            print(slowest["profiles"][source])


def main() -> None:
    """Parse the command line, run, print the report."""
    assert about is not None
    parser = argparse.ArgumentParser(description=about.splitlines()[0])
    parser.add_argument("--sizes", default="32M,256M", help="state per rank, comma separated")
    parser.add_argument("--rounds", type=int, default=5, help="saves per checkpointer")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--dir", type=Path, default=REPO, help="where the disk checkpoints go (a real disk)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print profiles of one recovery per size instead"
    )
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    with s3_target() as s3:
        if args.profile:
            _profile(sizes, args.rounds, args.dir, s3)
        else:
            print(report(sizes, args.rounds, args.out, args.dir, s3))


if __name__ == "__main__":
    main()
