"""The accelerator path: checkpoints of GPU-resident state, side by side with DCP and safetensors.

``python -m benchmarks.gpu`` (on a machine with a GPU) builds an fp32 state of
``--tensors`` CUDA tensors and measures, in one run on one disk, with the page
cache dropped before every load and every save fsynced:

* the references: the device-to-host copy of the state into preallocated pinned
  memory, and the raw parallel O_DIRECT write and read of the same bytes (32 MiB
  blocks, 4 in flight: :mod:`benchmarks.rawio`, from a host copy of the state);
* ``save_async`` stalls: the first of a new Checkpointer without ``prepare``, the
  first after ``prepare(state)`` (``prepare`` timed on its own: the cost moved off
  the training loop), and later saves; DCP ``async_save``'s stall;
* sync saves from the GPU: mouthguard, DCP (``FileSystemWriter``, 8 threads),
  safetensors ``save_file``;
* loads into the GPU: mouthguard ``load(into=GPU state)`` and ``load(device=...)``
  (both verified), DCP ``load`` into the GPU state, safetensors
  ``load_file(device=...)``.

Then it checks the accelerator targets (stated in the report) and writes
``docs/benchmarks-gpu.md``. ``--device cpu`` runs every step on CPU tensors, so
the harness itself is exercised where there is no GPU (its figures are then no
statement about GPUs, and the report says so).
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console

import mouthguard
from benchmarks.harness import CacheDrop, fsync_path, progress_bar
from benchmarks.rawio import RawIO
from benchmarks.report import load_line, machine_line
from benchmarks.state import REPO, parse_size, size_label
from mouthguard.tiers.local import LocalTier

DEFAULT_OUT = REPO / "docs" / "benchmarks-gpu.md"
DCP_THREADS = 8
console = Console(stderr=True)

D2H = "device-to-host copy into pinned memory (the stall reference)"
RAW_WRITE = "raw parallel O_DIRECT write + fsync"
RAW_READ = "raw parallel O_DIRECT read"
FIRST = "mouthguard save_async stall, first save, no prepare"
PREPARE = "mouthguard prepare(state) (off the training loop; not a stall)"
FIRST_PREPARED = "mouthguard save_async stall, first save after prepare"
STEADY = "mouthguard save_async stall, later saves"
ASYNC_TOTAL = "mouthguard save_async total (until result())"
DCP_STALL = "DCP async_save stall, later saves"
MG_SAVE = "mouthguard save (sync, durable, xxh3)"
DCP_SAVE = f"DCP save ({DCP_THREADS} threads)"
ST_SAVE = "safetensors save_file + fsync"
MG_LOAD_INTO = "mouthguard load(into=device state), verified"
MG_LOAD_DEVICE = "mouthguard load(device=...), verified"
DCP_LOAD = "DCP load into the device state"
ST_LOAD = "safetensors load_file(device=...)"


@dataclass
class Row:
    name: str
    times: list[float] = field(default_factory=list)
    unavailable: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def build_state(nbytes: int, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``n`` fp32 tensors of about ``nbytes / n`` bytes each, random, on ``device``."""
    gen = torch.Generator().manual_seed(0)
    per = max(1024, nbytes // n // 4 // 1024 * 1024)
    return {
        f"layer.{i}.weight": torch.empty(per // 1024, 1024)
        .uniform_(-1, 1, generator=gen)
        .to(device)
        for i in range(n)
    }


class Bench:
    """The measurements of the module docstring on one state under ``root``."""

    def __init__(self, state: dict[str, torch.Tensor], root: Path, repeats: int) -> None:
        self.state, self.root, self.repeats = state, root, repeats
        self.device = next(iter(state.values())).device
        self.cache = CacheDrop()
        self.rows: dict[str, Row] = {}
        self.step = 0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], object]) -> float:
        gc.collect()
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        elapsed = time.perf_counter() - t0
        del out
        return elapsed

    def add(self, name: str, seconds: float) -> None:
        self.rows.setdefault(name, Row(name)).times.append(seconds)

    def fresh(self, name: str) -> Path:
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def checkpointer(self, d: Path) -> mouthguard.Checkpointer:
        store = mouthguard.Store([LocalTier(d, name="fast", domain="a")])
        return mouthguard.Checkpointer(store, "gpu", background=False)

    # --- references ---

    def references(self) -> None:
        pinned = self.device.type == "cuda"
        host = {
            k: torch.empty(v.shape, dtype=v.dtype, pin_memory=pinned) for k, v in self.state.items()
        }

        def d2h() -> None:
            for k, v in self.state.items():
                host[k].copy_(v, non_blocking=pinned)

        d2h()  # touch the pages once, untimed
        for _ in range(self.repeats):
            self.add(D2H, self.time(d2h))
        raw = RawIO(host)
        d = self.fresh("raw")
        for _ in range(self.repeats):
            self.add(RAW_WRITE, self.time(lambda: raw.write(d)))
            self.cache.drop(d)
            self.add(RAW_READ, self.time(lambda: raw.read(d)))
        shutil.rmtree(d)

    # --- async stalls ---

    def stalls(self) -> None:
        for prepared in (False, True):
            d = self.fresh(f"first-{int(prepared)}")
            with closing(self.checkpointer(d)) as ckpt:
                if prepared:
                    self.add(PREPARE, self.time(lambda c=ckpt: c.prepare(self.state)))
                t0 = time.perf_counter()
                handle = ckpt.save_async(1, self.state)
                self.add(FIRST_PREPARED if prepared else FIRST, time.perf_counter() - t0)
                handle.result()
            shutil.rmtree(d)
        d = self.fresh("steady")
        with closing(self.checkpointer(d)) as ckpt:
            ckpt.save_async(0, self.state).result()
            for r in range(1, self.repeats + 1):
                os.sync()
                gc.collect()
                t0 = time.perf_counter()
                handle = ckpt.save_async(r, self.state)
                self.add(STEADY, time.perf_counter() - t0)
                handle.result()
                self.add(ASYNC_TOTAL, time.perf_counter() - t0)
            loaded = ckpt.load(self.repeats).state
            _check(self.state, loaded, "save_async")
        shutil.rmtree(d)
        try:
            self._dcp_async()
        except Exception as exc:  # noqa: BLE001 - a peer failing: its row says so
            self.rows[DCP_STALL] = Row(DCP_STALL, unavailable=f"{type(exc).__name__}: {exc}")

    def _dcp_async(self) -> None:
        from concurrent.futures import Future  # noqa: PLC0415

        for r in range(self.repeats + 1):
            d = self.fresh(f"dcp-async-{r}")
            writer = dcp.FileSystemWriter(str(d), thread_count=DCP_THREADS, sync_files=True)
            t0 = time.perf_counter()
            response = dcp.async_save(self.state, storage_writer=writer)  # type: ignore[attr-defined]
            stall = time.perf_counter() - t0
            future = response if isinstance(response, Future) else response.upload_completion
            future.result()
            if r:  # the first pays for DCP's setup, as mouthguard's first save does
                self.add(DCP_STALL, stall)
            shutil.rmtree(d)

    # --- sync saves and cold loads ---

    def saves_and_loads(self) -> None:
        template = {k: torch.zeros_like(v) for k, v in self.state.items()}
        dirs = {name: self.fresh(name.split()[0]) for name in (MG_SAVE, DCP_SAVE, ST_SAVE)}
        for _ in range(self.repeats):
            for name, d in dirs.items():
                shutil.rmtree(d)
                d.mkdir()
                os.sync()
                self.add(name, self.time(lambda n=name, p=d: self._save(n, p)))
        loads: list[tuple[str, Path, Callable[[Path], object]]] = [
            (MG_LOAD_INTO, dirs[MG_SAVE], lambda p: self._mg_load(p, into=template)),
            (MG_LOAD_DEVICE, dirs[MG_SAVE], self._mg_load),
            (DCP_LOAD, dirs[DCP_SAVE], lambda p: self._dcp_load(p, template)),
            (ST_LOAD, dirs[ST_SAVE], self._st_load),
        ]
        for r in range(self.repeats):
            for name, d, load in loads[r % len(loads) :] + loads[: r % len(loads)]:
                self.cache.drop(d)
                self.add(name, self.time(lambda f=load, p=d: f(p)))
        _check(self.state, template, "load(into=...) and DCP load")
        for d in dirs.values():
            shutil.rmtree(d)

    def _save(self, name: str, d: Path) -> None:
        if name == MG_SAVE:
            with closing(self.checkpointer(d)) as ckpt:
                ckpt.save(1, self.state)
        elif name == DCP_SAVE:
            writer = dcp.FileSystemWriter(str(d), thread_count=DCP_THREADS, sync_files=True)
            dcp.save(self.state, storage_writer=writer)
        else:
            safetensors.torch.save_file(self.state, str(d / "s.safetensors"))
            fsync_path(d / "s.safetensors")

    def _dcp_load(self, d: Path, template: dict[str, torch.Tensor]) -> object:
        dcp.load(template, storage_reader=dcp.FileSystemReader(str(d)))
        return template

    def _st_load(self, d: Path) -> object:
        return safetensors.torch.load_file(str(d / "s.safetensors"), device=str(self.device))

    def _mg_load(self, d: Path, into: object = None) -> object:
        with closing(self.checkpointer(d)) as ckpt:
            return ckpt.load(1, into=into, device=self.device).state


def _check(want: dict[str, torch.Tensor], got: object, what: str) -> None:
    assert isinstance(got, dict), what
    for name, tensor in want.items():
        if not torch.equal(got[name].to(tensor.device), tensor):
            raise AssertionError(f"{what}: {name} differs")


def report(bench: Bench, nbytes: int, machine: str, command: str) -> str:
    rows = bench.rows
    gib = nbytes / 2**30

    def speed(name: str) -> float:
        return gib / rows[name].median

    lines = [
        "# The accelerator path: GPU-resident state to disk and back",
        "",
        "Generated by `benchmarks/gpu.py`; do not edit by hand.",
        "",
        machine,
        "",
        "```bash",
        command,
        "```",
        "",
        f"State: {size_label(nbytes)} of fp32, {len(bench.state)} tensors on "
        f"`{bench.device}`; {bench.repeats} repeats, median shown. Saves are fsynced; the "
        f"page cache is dropped before every load ({bench.cache.describe()}).",
    ]
    if bench.device.type != "cuda":
        lines += ["", "**Run on the CPU (`--device cpu`): no statement about GPUs.**"]
    lines += ["", "| operation | median s | min-max s | GiB/s |", "|---|---|---|---|"]
    for row in rows.values():
        if row.unavailable or not row.times:
            lines.append(f"| {row.name} | not available: {row.unavailable} | | |")
            continue
        lines.append(
            f"| {row.name} | {row.median:.3f} | {min(row.times):.3f}-{max(row.times):.3f} | "
            f"{gib / row.median:.2f} |"
        )
    checks = [
        (
            "steady save_async stall <= 1.1x the device-to-host copy",
            rows[STEADY].median / rows[D2H].median,
            1.1,
            "le",
        ),
        (
            "first save_async stall (after prepare) <= 2x the steady stall",
            rows[FIRST_PREPARED].median / rows[STEADY].median,
            2.0,
            "le",
        ),
        (
            "sync save from the device >= 0.8x the raw write",
            speed(MG_SAVE) / speed(RAW_WRITE),
            0.8,
            "ge",
        ),
        (
            "load into the device, verified, >= 0.9x the raw read",
            max(speed(MG_LOAD_INTO), speed(MG_LOAD_DEVICE)) / speed(RAW_READ),
            0.9,
            "ge",
        ),
        (
            "load into the device >= 1.3x safetensors load_file(device=...)",
            max(speed(MG_LOAD_INTO), speed(MG_LOAD_DEVICE)) / speed(ST_LOAD),
            1.3,
            "ge",
        ),
    ]
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    for text, value, goal, how in checks:
        met = value <= goal if how == "le" else value >= goal
        lines.append(f"| {text} | {value:.2f}x | {'**met**' if met else '**not met**'} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    parser.add_argument("--size", default="4G", help="state size (default 4G)")
    parser.add_argument("--tensors", type=int, default=100, help="tensors (default 100)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to smoke-test")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        console.print("no CUDA device here: run the GPU mode on a machine with a GPU")
        return 2
    base = Path(tempfile.gettempdir()) if args.dir is None else args.dir
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".mouthguard-gpu-", dir=base))
    options = ["--size", args.size, "--tensors", str(args.tensors), "--repeats"]
    options += [str(args.repeats), "--device", args.device]
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.gpu", *options])
    try:
        machine = machine_line(root)
        load_before = os.getloadavg()
        if device.type == "cuda":
            machine += f" GPU: {torch.cuda.get_device_name(device)}."
        state = build_state(parse_size(args.size), args.tensors, device)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        bench = Bench(state, root, args.repeats)
        with progress_bar(console) as progress:
            task = progress.add_task("references: device-to-host copy, raw I/O", total=3)
            bench.references()
            progress.update(task, advance=1, description="save_async stalls (mouthguard, DCP)")
            bench.stalls()
            progress.update(task, advance=1, description="sync saves and cold loads")
            bench.saves_and_loads()
            progress.advance(task)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine = f"{machine}\n\n{load_line(load_before, os.getloadavg())}"
    text = report(bench, nbytes, machine, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    console.print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
