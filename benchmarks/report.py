"""The markdown report: the targets, then one table per size with a verdict on each target."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import safetensors
import torch
from rich.table import Table

import mouthguard
from benchmarks import mouthguard_ops as mg
from benchmarks.harness import Result
from benchmarks.memory import FLAT_MIB, OVERHEAD_MIB, Memory
from benchmarks.multirank import Files
from benchmarks.peers import DCP_FIRST_STALL
from benchmarks.state import GIB, MIB, size_label

#: Per kind of row, the rows its ratio columns compare against: (x DCP, x raw).
REFERENCES: dict[str, tuple[str | None, str | None]] = {
    "save": ("DCP save", "raw write"),
    "load": ("DCP load", "raw read"),
    "first stall": (DCP_FIRST_STALL, None),
    "stall": ("DCP async_save — stall", None),
    "async": ("DCP async_save — total", "raw write"),
    "copy": (None, None),
}
COLUMNS = ("operation", "median s", "min-max s", "GiB/s", "x DCP", "x raw")


@dataclass
class SizeRun:
    """Everything measured for one state size."""

    nbytes: int
    n_tensors: int
    repeats: int
    results: list[Result]
    memory: Memory
    files: Files
    direct_ok: bool | None
    seconds: float


def find(results: list[Result], name: str) -> Result:
    """The row called ``name``, else the first whose name starts with it."""
    for r in results:
        if r.name == name:
            return r
    for r in results:
        if r.name.startswith(name):
            return r
    raise KeyError(name)


def _ratio(results: list[Result], ref: str | None, row: Result) -> str:
    """Throughput ratio of ``row`` against the row named ``ref`` (higher is faster)."""
    if ref is None:
        return "-"
    other = find(results, ref)
    if not (other.ok and row.ok):
        return "-"
    return f"{other.median / row.median:.2f}"


def _cells(run: SizeRun, r: Result) -> list[str]:
    name = r.name + (f" — {r.note}" if r.note and r.ok else "")
    if not r.ok:
        return [f"{r.name} — **not available**: {r.unavailable}", "-", "-", "-", "-", "-"]
    dcp_ref, raw_ref = REFERENCES[r.kind]
    return [
        name,
        f"{r.median:.3f}",
        f"{min(r.times):.3f}-{max(r.times):.3f}",
        f"{run.nbytes / GIB / r.median:.2f}",
        _ratio(run.results, dcp_ref, r),
        _ratio(run.results, raw_ref, r),
    ]


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


class _Targets:
    """Builds the targets table; a target whose inputs are missing says why."""

    def __init__(self) -> None:
        self.lines = ["| target | goal | measured | verdict |", "|---|---|---|---|"]

    def ratio(self, target: str, goal: str, num: Result, den: Result, ok: float | None) -> None:
        """``num``'s median time over ``den``'s.

        Met when the ratio is >= ``ok`` (``goal`` starts with ≥) or <= ``ok``
        (``goal`` starts with ≤); ``ok=None`` is context without a goal.
        """
        missing = next((r for r in (num, den) if not r.ok), None)
        if missing is not None:
            why = f"not available ({missing.unavailable})"
            self.lines.append(_row(target, goal, "-", why))
            return
        x = num.median / den.median
        if ok is None:
            self.lines.append(_row(target, goal, f"{x:.2f}x", "-"))
            return
        met = x >= ok if goal.startswith("≥") else x <= ok
        self.lines.append(_row(target, goal, f"{x:.2f}x", verdict(met)))

    def add(self, target: str, goal: str, measured: str, result: str) -> None:
        self.lines.append(_row(target, goal, measured, result))


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def targets(run: SizeRun) -> list[str]:
    res = run.results
    t = _Targets()
    save, raw_write = find(res, mg.SAVE), find(res, "raw write")
    raw = "O_DIRECT" if run.direct_ok else "buffered+fsync (O_DIRECT refused)"
    t.ratio("durable sync save vs DCP save", "≥ 1.0x", find(res, "DCP save"), save, 1.0)
    t.ratio(f"durable sync save vs raw {raw} write", "≥ 0.8x", raw_write, save, 0.8)
    stall = find(res, mg.ASYNC_STALL)
    t.ratio("async save stall / memcpy of the state", "≤ 2.0x", stall, find(res, "memcpy"), 2.0)
    dcp_stall = find(res, "DCP async_save — stall")
    t.ratio("async save stall / DCP `async_save` stall", "≤ 0.33x", stall, dcp_stall, 1 / 3)
    loads = [r for r in (find(res, mg.LOAD), find(res, mg.LOAD_INTO)) if r.ok]
    best = min(loads, key=lambda r: r.median, default=find(res, mg.LOAD))
    which = "into=" if best.name == mg.LOAD_INTO else "plain"
    st_load, dcp_load = find(res, "safetensors load_file"), find(res, "DCP load")
    t.ratio(f"cold load vs safetensors `load_file` (best: {which})", "≥ 1.0x", st_load, best, 1.0)
    t.ratio(f"cold load vs DCP load (best: {which})", "≥ 2.0x", dcp_load, best, 2.0)
    unverified = find(res, mg.SAVE_UNVERIFIED)
    t.ratio("checksum cost: verified save / unverified save", "≤ 1.1x", save, unverified, 1.1)
    _memory_targets(t, run.memory)
    _files_target(t, run.files)
    t.ratio("(context) with_sha256 save / default save", "-", find(res, mg.SAVE_SHA256), save, None)
    async_total, dcp_total = find(res, mg.ASYNC_TOTAL), find(res, "DCP async_save — total")
    t.ratio(
        "(context) async save total / DCP `async_save` total", "-", async_total, dcp_total, None
    )
    first = find(res, mg.ASYNC_FIRST_STALL)
    t.ratio("(context) first async save stall / later stall", "-", first, stall, None)
    return t.lines


def _memory_targets(t: _Targets, m: Memory) -> None:
    goal = f"≤ {OVERHEAD_MIB} MiB"
    name = "memory: peak RSS - baseline - state - one staging copy"
    flat = f"memory: growth from save 5 to save {len(m.rss) or 20}"
    if not m.ok:
        t.add(name, goal, "-", f"not available ({m.unavailable})")
        t.add(flat, f"flat (≤ {FLAT_MIB} MiB)", "-", f"not available ({m.unavailable})")
        return
    t.add(
        name,
        goal,
        f"{_mib(m.overhead)} (peak {_mib(m.peak)}, baseline {_mib(m.baseline)}; "
        f"with the baseline counted: {_mib(m.overhead_with_interpreter)})",
        verdict(m.overhead <= OVERHEAD_MIB * MIB),
    )
    rss, hwm = m.growth
    t.add(
        flat,
        f"flat (≤ {FLAT_MIB} MiB)",
        f"VmRSS {rss / MIB:+.0f} MiB, VmHWM {hwm / MIB:+.0f} MiB",
        verdict(m.flat),
    )


def _files_target(t: _Targets, f: Files) -> None:
    name = f"files per checkpoint ({f.world_size} ranks, gloo)"
    goal = f"world_size + 1 = {f.world_size + 1}"
    if not f.ok:
        t.add(name, goal, "-", f"not available ({f.unavailable})")
        return
    t.add(
        name,
        goal,
        f"{len(f.names)} ({', '.join(f.names)})",
        verdict(len(f.names) == f.world_size + 1),
    )


def memory_line(m: Memory) -> list[str]:
    if not m.ok:
        return []
    picks = [i for i in (0, 4, 9, len(m.rss) - 1) if i < len(m.rss)]
    at = ", ".join(f"{i + 1}: {_mib(m.rss[i])} / {_mib(m.hwm[i])}" for i in dict.fromkeys(picks))
    return [
        f"Memory: a fresh process with this state (RSS {_mib(m.with_state)}; "
        f"{_mib(m.baseline)} before the state was built) made {len(m.rss)} async saves in "
        f"{m.seconds:.1f} s. VmRSS / VmHWM after save {at}.",
        "",
    ]


def size_section(run: SizeRun) -> tuple[list[str], Table]:
    label = size_label(run.nbytes)
    lines = [
        f"## {label} state ({run.nbytes / GIB:.3f} GiB fp32, {run.n_tensors} tensors, "
        f"{run.repeats} repeat{'s' * (run.repeats != 1)}, {run.seconds:.0f} s)",
        "",
        "Ratios are throughput ratios (higher is faster): a save against DCP save and the",
        "raw write; a load against DCP load and the raw read; a stall against DCP",
        "`async_save`'s stall (a first-save stall against DCP's first); an async total against",
        "DCP `async_save`'s total and the raw write.",
        "",
        _row(*COLUMNS),
        "|---|---:|---:|---:|---:|---:|",
    ]
    table = Table(title=f"{label} state")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "operation" else "right")
    for r in run.results:
        cells = _cells(run, r)
        lines.append(_row(*cells))
        table.add_row(*cells)
    lines += ["", f"### Targets at {label} (stated under “Targets” above)", "", *targets(run), ""]
    lines += memory_line(run.memory)
    return lines, table


def machine_line(root: Path, versions: str | None = None) -> str:
    """CPUs, memory, the filesystem of ``root``, Python and ``versions``, date.

    ``versions``: the packages the report compares (default torch, safetensors
    and mouthguard), as ``"name version, ..."``.
    """
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    fs = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = (
            subprocess.run(["df", "-T", str(root)], capture_output=True, text=True, check=True)
            .stdout.splitlines()[1]
            .split()
        )
        # The filesystem's type, not its device or mount path: those name this machine.
        fs = f"{out[1]} ({'the root filesystem' if out[-1] == '/' else 'a separate mount'})"
    if versions is None:
        versions = (
            f"torch {torch.__version__}, safetensors {safetensors.__version__}, "
            f"mouthguard {mouthguard.__version__}"
        )
    return (
        f"Machine: {os.cpu_count()} CPUs ({cpu}), {mem} memory; filesystem of the benchmark "
        f"directory: {fs}; Python {platform.python_version()}, {versions}; "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC."
    )


def load_line(before: tuple[float, float, float], after: tuple[float, float, float]) -> str:
    """The machine's load averages (1, 5, 15 min) when the run started and ended.

    On a machine shared with other work every figure is slower than the disk
    allows; the load says how much else was running.
    """
    fmt = "/".join
    return (
        f"Load average (1/5/15 min) at the start: {fmt(f'{x:.2f}' for x in before)}; "
        f"at the end: {fmt(f'{x:.2f}' for x in after)} ({os.cpu_count()} CPUs)."
    )


def document(
    machine: str, command: str, total: float, cache: str, sections: list[str], load: str = ""
) -> str:
    doc = [
        "# Benchmarks",
        "",
        "Generated by `benchmarks/run.py` (see `benchmarks/README.md`); do not edit by hand.",
        "Dataset loaders (mouthguard next to webdataset, mosaicml-streaming, litdata and raw",
        "files): [benchmarks-data.md](benchmarks-data.md), from `python -m benchmarks.data`.",
        "",
        machine,
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Total runtime: {total:.0f} s. Page cache between loads: {cache}.",
        "",
        *([load, ""] if load else []),
        *TARGETS,
        "",
        "## What the figures count",
        "",
        "Each row times one operation on the same state (fp32 tensors, one process, one",
        "directory on the disk named above). *median s* and *min-max s* are over the",
        "repeats; *GiB/s* is the state's tensor bytes over the median time (file headers,",
        "the manifest and pickling overhead are not counted as bytes moved, though their",
        "time is). All saves are durable (file `fsync`; DCP uses its own `sync_files=True`);",
        "every repeat writes a fresh directory. The raw write copies the tensors into aligned",
        "32 MiB buffers and writes them sequentially, 4 in flight; the raw read reads into",
        "those buffers only. A load is timed until every page of what it returns is in",
        "memory (safetensors' `load_file` maps the file lazily). The async rows (DCP and",
        "mouthguard) time the saves after the first, as a training loop's later saves see",
        "them; the first save's stall, which pays one-time setup (DCP's thread pool,",
        "mouthguard's staging buffer), is its own row, one measurement per run. Memory is",
        "measured in a fresh process; the files per checkpoint once per run, on a small",
        "state (the count does not depend on the size). Not measured here: anything on a",
        "GPU, multi-node writes, and object-store tiers.",
        "",
        *sections,
    ]
    return "\n".join(doc).rstrip() + "\n"


#: The targets, stated here so the report carries them (checked per size below).
TARGETS = [
    "## Targets",
    "",
    "What mouthguard aims for, as ratios against its peers and the disk measured in the",
    "same run on the same state and disk (absolute speeds depend on the machine; ratios",
    "carry across machines). Each size section checks every one with a verdict.",
    "",
    "| what | target |",
    "|---|---|",
    "| durable synchronous save | at least DCP's save throughput, and at least 0.8 of the "
    "raw O_DIRECT write of the same bytes |",
    "| async save stall (how long the training loop is blocked) | at most twice a plain "
    "memcpy of the state, and at most a third of DCP `async_save`'s stall |",
    "| cold load | at least `safetensors.load_file`'s throughput, and twice DCP's load |",
    "| checksums | a verified save takes at most 1.1 times the same save unverified |",
    "| memory of async saves | peak RSS at most the state + one staging copy + 256 MiB, and "
    "flat (within 32 MiB) from the 5th to the 20th save: the staging buffer is reused |",
    "| files per checkpoint | world size + 1: one file per rank and the manifest, never a "
    "file per tensor |",
    "",
    "Targets for a GPU, which this CPU benchmark does not measure: an async save from CUDA",
    "tensors stalls at most 1.1 times the device-to-host copy of the state, every save",
    "including the first (the first at most twice the later ones); a sync save from CUDA",
    "tensors reaches 0.8 of a raw parallel O_DIRECT write; a verified load into CUDA",
    "tensors reaches 0.9 of a raw parallel read and 1.3 times",
    '`safetensors.load_file(device="cuda")`; the stall while the previous save is still',
    "replicating stays within 1.25 times a memcpy. On this CPU run the first-save stall is",
    "reported as context. `python -m benchmarks.gpu` measures the GPU targets on a GPU",
    "machine, `python -m benchmarks.stall` the stall with replication in flight and the",
    "first save after `prepare`, `python -m benchmarks.weights` model weight loading",
    "(see docs/accelerator.md).",
]
