"""``python -m benchmarks.data``: dataset loaders side by side, one run, one report.

Writes the same samples in every reader's format (:mod:`benchmarks.data.writers`),
then measures every reader (:mod:`benchmarks.data.readers`) on the local disk and
on a throwaway S3 server (:mod:`benchmarks.data.s3`), each cell in a fresh process
(:mod:`benchmarks.data.child`) after the page cache was dropped and the loader's
cache emptied: a cold epoch and a warm one, with each number of workers; then the
same with a simulated training step (the stall check). Writes the markdown report
(:mod:`benchmarks.data.report`). See ``benchmarks/README.md``, "Dataset loaders".
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.data import config, opens, report, report_prose, s3, spawn
from benchmarks.data.child import MARK
from benchmarks.data.config import Cell, CellResult, Site
from benchmarks.data.samples import sample_count
from benchmarks.data.writers import tree_bytes
from benchmarks.harness import CacheDrop
from benchmarks.state import parse_size, size_label

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "benchmarks-data.md"
DEFAULTS = {"size": "1G", "workers": "1,4", "stall_workers": "4"}
QUICK = {"size": "16M", "workers": "0", "stall_workers": "2"}
#: The module each peer needs (the bench-data extra installs them).
MODULES = {"webdataset": "webdataset", "mosaic": "streaming", "litdata": "litdata"}
#: The order datasets are written in: mouthguard packs the raw files.
WRITE_ORDER = ("raw", "webdataset", "mosaic", "litdata", "mouthguard")
console = Console(stderr=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__)
    parser.add_argument("--size", help="dataset size (default 1G; --quick: 16M)")
    parser.add_argument("--sample-size", default="100K", help="bytes per sample (default 100K)")
    parser.add_argument(
        "--sample-sizes",
        help="several sample sizes (e.g. 10K,100K,1M), each measured in turn, its own tables; "
        "overrides --sample-size",
    )
    parser.add_argument("--shard-size", default="64M", help="shard/chunk size, every format")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", help="DataLoader workers per cell (default 1,4)")
    parser.add_argument("--stall-workers", help="workers of the stall check (default 4)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="simulated training step")
    parser.add_argument("--sources", default="local,s3", help="local, s3 or both")
    parser.add_argument(
        "--s3-latency-ms",
        type=float,
        default=0.0,
        help="delay added to every S3 request of the cells by a loopback proxy (default 0)",
    )
    parser.add_argument(
        "--persistent-workers",
        action="store_true",
        help="every reader's DataLoader keeps its workers across epochs (persistent_workers=True)",
    )
    parser.add_argument("--readers", default=",".join(config.READERS), help="which readers")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every cell (median)")
    parser.add_argument("--cell-timeout", type=float, default=600.0, help="seconds per cell")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 16M, workers 0, stall with 2"
    )
    parser.add_argument(
        "--preloaded-children",
        action="store_true",
        help="fork every child from one process that has imported torch (about 2.7 s less "
        "per child; --quick implies it) instead of starting a fresh interpreter",
    )
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report")
    args = parser.parse_args(argv)
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else default)
    args.preloaded_children = args.preloaded_children or args.quick
    args.readers_list = [r for r in args.readers.split(",") if r]
    args.sources_list = [s for s in args.sources.split(",") if s]
    unknown = set(args.readers_list) - set(config.READERS)
    unknown |= set(args.sources_list) - set(config.SOURCES)
    if unknown:
        parser.error(f"unknown readers or sources: {', '.join(sorted(unknown))}")
    args.workers_list = [int(w) for w in args.workers.split(",")]
    args.stall_list = [int(w) for w in args.stall_workers.split(",") if w]
    if args.repeats < 1 or not args.readers_list or not args.sources_list:
        parser.error("need a repeat, a reader and a source")
    if args.s3_latency_ms < 0:
        parser.error(f"--s3-latency-ms must be ≥ 0, got {args.s3_latency_ms}")
    sizes = args.sample_sizes.split(",") if args.sample_sizes else [args.sample_size]
    try:
        args.sample_size_list = [parse_size(s) for s in sizes if s]
    except ValueError as exc:
        parser.error(f"bad sample size: {exc}")
    if not args.sample_size_list or min(args.sample_size_list) < 1:
        parser.error(f"sample sizes must be at least 1 byte, got {sizes}")
    return args


def reproduce(argv: list[str] | None) -> str:
    given = list(sys.argv[1:] if argv is None else argv)
    return shlex.join([".venv/bin/python", "-m", "benchmarks.data", *given])


def default_root() -> Path:
    """A temp dir on the repository's filesystem (``/tmp`` if it shares it)."""
    tmp = Path(tempfile.gettempdir())
    base = tmp if tmp.stat().st_dev == REPO.stat().st_dev else REPO
    return Path(tempfile.mkdtemp(prefix=".mouthguard-data-bench-", dir=base))


def missing_peer(reader: str) -> str:
    """Why ``reader`` cannot run here ('' when it can)."""
    module = MODULES.get(reader)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"`{module}` is not installed (`pip install -e '.[bench-data]'`)"
    return ""


class Runner:
    """Runs child processes for one benchmark: writes, uploads and cells."""

    def __init__(
        self,
        args: argparse.Namespace,
        root: Path,
        tick: Callable[[str], None],
        log: Callable[[str], None],
        sample_size: int,
    ) -> None:
        self.args, self.root, self.tick, self.log = args, root, tick, log
        self.samples = sample_count(parse_size(args.size), sample_size)
        self.sample_size = sample_size
        self.shard_size = parse_size(args.shard_size)
        self.cache = CacheDrop()
        self.opens_problem = opens.problem(root / "opens-probe")
        # The repository first, then what the parent had: a parent run with this checkout's
        # src/ on its PYTHONPATH measures this checkout, not whichever one is installed.
        path = [str(REPO), os.environ.get("PYTHONPATH", "")]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.launcher: spawn.Launcher = (
            spawn.PreloadedChildren(REPO, self.env)
            if args.preloaded_children
            else spawn.FreshChildren(REPO)
        )
        self.failed: dict[str, str] = {}  # reader -> why its data could not be written
        self.setup: list[report.SetupRow] = []
        self.results: list[CellResult] = []
        self.s3_env: dict[str, str] = {}  # the server's settings, while it runs
        self.server_version = ""

    def child(self, argv: list[str], env: dict[str, str]) -> tuple[str, str]:
        """Run ``python -m benchmarks.data.child ARGV``: (the result after MARK, or '', why)."""
        done = self.launcher.run(argv, env, self.args.cell_timeout)
        if done.returncode is None:
            return "", f"did not finish within {self.args.cell_timeout:.0f} s (killed)"
        found = [line[len(MARK) :] for line in done.stdout.splitlines() if line.startswith(MARK)]
        if found:
            return found[-1], ""
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return "", f"exit {done.returncode}: {tail[-1][:300] if tail else 'no output'}"

    def stop_child(self) -> None:
        """Kill the child running now, with its DataLoader workers; release the launcher."""
        self.launcher.close()

    def write(self, reader: str) -> None:
        why = missing_peer(reader)
        seconds = 0.0
        if not why:
            argv = ["write", reader, str(self.root), str(self.samples), str(self.sample_size)]
            out, why = self.child([*argv, str(self.shard_size)], self.env)
            seconds = float(out) if out else 0.0
        where = config.dataset_dir(self.root, reader)
        files, size = tree_bytes(where) if where.is_dir() else (0, 0)
        self.setup.append(report.SetupRow("write", reader, seconds, files, size, why))
        if why:
            self.failed[reader] = f"its dataset could not be written ({why})"
        self.tick(f"wrote {reader}")

    def upload(self, reader: str, site: Site, env: dict[str, str]) -> str:
        why = self.failed.get(reader, "")
        seconds = 0.0
        if not why:
            argv = ["upload", reader, str(self.root), site_json(site), str(self.shard_size)]
            out, why = self.child(argv, env)
            seconds = float(out) if out else 0.0
        self.setup.append(report.SetupRow("upload", reader, seconds, 0, 0, why))
        self.tick(f"uploaded {reader}")
        return why

    def cell(
        self, reader: str, source: str, workers: int, mode: str, site: Site | None = None
    ) -> None:
        """Prepare the cold state, run one cell in a fresh process, keep its result."""
        cell = Cell(
            reader=reader,
            source=source,
            workers=workers,
            mode=mode,
            root=str(self.root),
            samples=self.samples,
            sample_size=self.sample_size,
            batch_size=self.args.batch_size,
            step_s=self.args.step_ms / 1000,
            count_opens=self.opens_problem is None,
            site=site,
            persistent=self.args.persistent_workers,
        )
        why = self.failed.get(reader, "") or missing_peer(reader)
        if not why:
            shutil.rmtree(config.cache_dir(self.root, reader, source), ignore_errors=True)
            data = config.dataset_dir(self.root, reader)
            if data.is_dir() and reader != "memory":
                self.cache.drop(data)
            # Cold means nothing known: mouthguard's verification record (which a new
            # process would otherwise trust) starts empty too, so every shard is hashed.
            record = self.root / "verified-record"
            shutil.rmtree(record, ignore_errors=True)
            env = self.env if site is None else {**self.env, **self.s3_env}
            env = {**env, "MOUTHGUARD_VERIFIED_DIR": str(record)}
            out, why = self.child(["read", cell.to_json()], env)
            if out:
                result = CellResult.from_json(out)
                self.results.append(result)
                self.log(summary(result))
                self.tick(f"{reader} {source} w={workers} {mode}")
                return
        self.log(f"{reader} {source} w={workers} {mode}: not available: {why}")
        self.results.append(CellResult(reader, source, workers, mode, unavailable=why))
        self.tick(f"{reader} {source} w={workers} {mode}")


def summary(result: CellResult) -> str:
    """One line per cell for the console: samples/s (or p99 wait) and load per epoch."""
    head = f"{result.reader} {result.source} w={result.workers} {result.mode}:"
    if result.unavailable:
        return f"{head} not available: {result.unavailable}"
    parts = []
    for e in result.epochs:
        if e.waits:
            p99 = report.percentile(e.waits[1:] or e.waits, 99) * 1000
            figure = f"first {e.waits[0] * 1000:.0f} ms, p99 {p99:.1f} ms"
        else:
            figure = f"{e.samples / e.seconds:.0f} samples/s in {e.seconds:.1f} s"
        parts.append(f"{e.state} {figure} (load {e.load_before:.1f})")
    return f"{head} {'; '.join(parts)}"


def site_json(site: Site) -> str:
    import json  # noqa: PLC0415

    return json.dumps({"endpoint": site.endpoint, "bucket": site.bucket, "log": site.log})


def rotated(items: list[str], by: int) -> list[str]:
    """``items`` rotated left by ``by``: no reader always runs first after a drop."""
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def run_local(run: Runner, readers: list[str]) -> None:
    for rep in range(run.args.repeats):
        for i, workers in enumerate(run.args.workers_list):
            for reader in rotated(readers, rep + i):
                run.cell(reader, "local", workers, "throughput")
        for workers in run.args.stall_list:
            for reader in rotated(readers, rep):
                run.cell(reader, "local", workers, "stall")


def run_s3(run: Runner, readers: list[str]) -> str:
    """Every S3 cell, one reader's copy in the bucket at a time; '' or why S3 was skipped."""
    try:
        with s3.Server() as server, s3.delayed(server, run.args.s3_latency_ms / 1000) as far:
            assert server.site is not None
            site = server.site
            run.s3_env, run.server_version = far.env, server.version
            # Uploads go straight to the server; only the cells' reads pay the delay.
            env = {**run.env, **server.env}
            # The stall targets judge the warm wait against the DataLoader's own floor,
            # measured in the same table: the in-memory reader reads nothing from S3.
            for _ in range(run.args.repeats):
                for workers in run.args.stall_list:
                    run.cell("memory", "s3", workers, "stall", far.site)
            for reader in readers:
                why = run.upload(reader, site, env)
                if why:
                    run.failed.setdefault(reader, f"the upload failed ({why})")
                for _ in range(run.args.repeats):
                    for workers in run.args.workers_list:
                        run.cell(reader, "s3", workers, "throughput", far.site)
                    for workers in run.args.stall_list:
                        run.cell(reader, "s3", workers, "stall", far.site)
                # The server keeps objects in RAM: one reader's copy at a time.
                run.child(["delete", site_json(site), config.s3_prefix(reader)], env)
                if why := server.reclaim():
                    run.log(f"[red]reclaiming the deleted copy of {reader} failed: {why}")
    except s3.StartError as exc:
        return str(exc)
    return ""


def measure(run: Runner, writes: list[str], local: list[str], remote: list[str]) -> str:
    """Write every dataset, then every cell; '' or why the S3 rows could not be measured."""
    args = run.args
    for reader in writes:
        run.write(reader)
    if "local" in args.sources_list:
        run_local(run, local)
    if "s3" not in args.sources_list or not remote:
        return ""
    skipped = run_s3(run, remote)
    if skipped:  # every S3 row says why
        modes = (("throughput", args.workers_list), ("stall", args.stall_list))
        run.results += [
            CellResult(reader, "s3", w, mode, unavailable=skipped)
            for reader in remote
            for mode, counts in modes
            for w in counts
        ]
    return skipped


def run_info(args: argparse.Namespace, run: Runner, s3_skipped: str, label: bool) -> report.RunInfo:
    """What the report says about one sample size's measurements (run-wide fields blank)."""
    return report.RunInfo(
        machine="",
        command="",
        seconds=0.0,
        load_start=(0.0, 0.0, 0.0),
        load_end=(0.0, 0.0, 0.0),
        samples=run.samples,
        sample_size=run.sample_size,
        shard_size=run.shard_size,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        repeats=args.repeats,
        cache=report_prose.cache_text(run.cache),
        opens_problem=run.opens_problem,
        s3_problem=s3_skipped,
        server=run.server_version,
        sources=args.sources_list,
        stall_workers=args.stall_list,
        s3_latency_ms=args.s3_latency_ms,
        persistent_workers=args.persistent_workers,
        preloaded_children=args.preloaded_children,
        label=f"{size_label(run.sample_size)} samples: " if label else "",
    )


def _terminate(signum: int, frame: object) -> None:
    del frame
    raise SystemExit(128 + signum)  # unwinds: the child, the S3 server and the temp dir go


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    owned = args.dir is None
    root = default_root() if owned else args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    readers = args.readers_list
    local_readers = [r for r in config.READERS if r in readers]
    s3_readers = [r for r in local_readers if r not in config.LOCAL_ONLY]
    writes = [r for r in WRITE_ORDER if any(config.dataset_dir(root, x).name == r for x in readers)]
    if "mouthguard" in writes and "raw" not in writes:
        writes.insert(0, "raw")  # pack reads the raw files
    runs = len(writes) + (len(args.workers_list) + len(args.stall_list)) * args.repeats * (
        len(local_readers) * ("local" in args.sources_list)
        + len(s3_readers) * ("s3" in args.sources_list)
    )
    runs += len(s3_readers) * ("s3" in args.sources_list)  # the uploads
    runs += len(args.stall_list) * args.repeats * ("s3" in args.sources_list)  # the S3 floor
    runs *= len(args.sample_size_list)
    started = time.perf_counter()
    load_start = os.getloadavg()
    machine = report.machine_line(root)
    measured: list[tuple[Runner, str]] = []
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("writing", total=runs)

            def tick(what: str) -> None:
                progress.update(task, advance=1, description=what)

            for sample_size in args.sample_size_list:
                run = Runner(args, root, tick, progress.console.print, sample_size)
                try:
                    measured.append((run, measure(run, writes, local_readers, s3_readers)))
                finally:
                    run.stop_child()
                    # The next sample size writes every dataset afresh.
                    for name in ("datasets", "cache"):
                        shutil.rmtree(root / name, ignore_errors=True)
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
        else:  # --dir: remove what was written, keep the directory
            for name in ("datasets", "cache", "opens-probe"):
                shutil.rmtree(root / name, ignore_errors=True)
    several = len(measured) > 1
    parts = [
        report.Part(run_info(args, run, skipped, several), run.setup, run.results)
        for run, skipped in measured
    ]
    first = parts[0].info
    info = replace(
        first,
        machine=machine,
        command=reproduce(argv),
        seconds=time.perf_counter() - started,
        load_start=load_start,
        load_end=os.getloadavg(),
        s3_problem="; ".join(dict.fromkeys(p.info.s3_problem for p in parts if p.info.s3_problem)),
        server=next((p.info.server for p in parts if p.info.server), ""),
    )
    doc, tables = report.document(info, parts)
    for table in tables:
        console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(doc)
    console.print(f"wrote {args.out} in {info.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
