"""Side-by-side checkpoint benchmarks: mouthguard against its peers and the disk's limit.

One run measures, on the same state and the same disk: memcpy, raw O_DIRECT I/O,
torch.save/load, safetensors, DCP (sync and async_save) and mouthguard (sync save
with and without checksums, async save, cold loads), the memory of 20 async saves
in a fresh process, and the files per checkpoint of a 2-rank save; then checks the
performance targets the report states (:data:`benchmarks.report.TARGETS`). See
``benchmarks/README.md`` for every row.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress, TaskID

from benchmarks import memory, multirank
from benchmarks.harness import CacheDrop, Harness, progress_bar
from benchmarks.mouthguard_ops import Mouthguard
from benchmarks.peers import Peers
from benchmarks.report import SizeRun, document, load_line, machine_line, size_section
from benchmarks.state import build_state, check_equal, parse_size, size_label, state_nbytes

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "benchmarks.md"
DEFAULT_SIZES, DEFAULT_REPEATS = "256M,2G", 3
QUICK_SIZES, QUICK_REPEATS = "256M", 1
#: Progress ticks per repeat: every timed operation (see run_size), plus memory's one.
TICKS_PER_REPEAT = 19
console = Console(stderr=True)


class _Bar:
    """A rich progress task as the harness's Ticker."""

    def __init__(self, progress: Progress, task: TaskID, label: str) -> None:
        self.progress, self.task, self.label = progress, task, label

    def stage(self, desc: str) -> None:
        self.progress.update(self.task, description=f"{self.label}: {desc}")

    def tick(self) -> None:
        self.progress.advance(self.task)


def run_size(
    nbytes: int, root: Path, repeats: int, files: multirank.Files, progress: Progress
) -> tuple[SizeRun, CacheDrop]:
    label = size_label(nbytes)
    task = progress.add_task(f"{label}: building state", total=None)
    bar = _Bar(progress, task, label)
    t0 = time.perf_counter()
    state = build_state(nbytes)
    progress.update(task, total=TICKS_PER_REPEAT * repeats + 1, completed=0)
    h = Harness(state, root, repeats, bar)
    template = {k: torch.zeros_like(v) for k, v in state.items()}
    peers = Peers(h, template)
    peers.memcpy()
    peers.raw()
    peers.torch_pair()
    peers.safetensors_pair()
    peers.dcp_pair()
    peers.dcp_async()
    mg = Mouthguard(h, template)
    mg.sync()
    mg.encrypted()
    mg.async_save()
    bar.stage("cold loads, every peer's interleaved")
    h.run_loads()
    # Correctness spot-check (untimed): DCP's and mouthguard's in-place loads gave it back.
    check_equal(state, template, "DCP load / mouthguard load(into=...)")
    direct_ok = peers.direct_ok
    del template, peers, mg
    gc.collect()
    bar.stage(f"memory ({memory.SAVES} async saves in a fresh process)")
    mem = memory.measure(nbytes, root)
    bar.tick()
    bar.stage("done")
    run = SizeRun(
        nbytes=state_nbytes(state),
        n_tensors=len(state),
        repeats=repeats,
        results=h.results,
        memory=mem,
        files=files,
        direct_ok=direct_ok,
        seconds=time.perf_counter() - t0,
    )
    return run, h.cache


def default_root() -> Path:
    """A temp dir on the repo's filesystem: /tmp if it shares it, else next to the repo."""
    tmp = Path(tempfile.gettempdir())
    base = tmp if tmp.stat().st_dev == REPO.stat().st_dev else REPO
    return Path(tempfile.mkdtemp(prefix=".mouthguard-bench-", dir=base))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument(
        "--sizes", help=f"comma-separated state sizes (default {DEFAULT_SIZES}, e.g. 256M,2G)"
    )
    parser.add_argument(
        "--repeats", type=int, help=f"runs per operation (default {DEFAULT_REPEATS})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: --sizes {QUICK_SIZES} --repeats {QUICK_REPEATS} unless given",
    )
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    args.size_list = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.repeats < 1 or not args.size_list:
        parser.error("need at least one size and one repeat")
    return args


def reproduce(args: argparse.Namespace) -> str:
    cmd = [".venv/bin/python", "-m", "benchmarks.run", "--sizes", args.sizes]
    cmd += ["--repeats", str(args.repeats)]
    if args.dir is not None:
        cmd += ["--dir", str(args.dir)]
    if args.out.resolve() != DEFAULT_OUT:
        cmd += ["--out", str(args.out)]
    return shlex.join(cmd)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    owned = args.dir is None
    root = default_root() if owned else args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    machine = machine_line(root)
    sections: list[str] = []
    caches: list[CacheDrop] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        with progress_bar(console) as progress:
            task = progress.add_task(f"files per checkpoint: {multirank.WORLD_SIZE} ranks", total=1)
            files = multirank.measure(root)
            progress.update(task, completed=1)
            for nbytes in args.size_list:
                run, cache = run_size(nbytes, root, args.repeats, files, progress)
                lines, table = size_section(run)
                sections += lines
                caches.append(cache)
                progress.console.print(table)
                del run
                gc.collect()
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - started
    load = load_line(load_before, os.getloadavg())
    doc = document(machine, reproduce(args), total, caches[0].describe(), sections, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(doc)
    console.print(f"wrote {args.out} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
