"""Side-by-side checkpoint benchmarks: mouthguard against its peers and the disk's limit.

Run ``python -m benchmarks.run --help``. See ``benchmarks/README.md`` for how to read
the output (``docs/benchmarks.md`` by default).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import mmap
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import mouthguard
from mouthguard.tiers.local import LocalTier

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
CHUNK = 8 * 1024 * 1024  # raw I/O chunk (a multiple of every O_DIRECT alignment)
N_TENSORS = 50
console = Console(stderr=True)


# --- the state ---------------------------------------------------------------------------


def parse_size(text: str) -> int:
    """``256M`` -> bytes (binary units: K, M, G, T)."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def size_label(nbytes: int) -> str:
    for unit, div in (("G", GIB), ("M", 1024**2), ("K", 1024)):
        if nbytes % div == 0:
            return f"{nbytes // div}{unit}"
    return str(nbytes)


def build_state(nbytes: int) -> dict[str, torch.Tensor]:
    """~50 fp32 tensors of mixed sizes (matrices, embeddings, biases), deterministic."""
    total = nbytes // 4
    # A transformer-ish mix: per "layer" a big matrix, a medium one, a small one, a bias.
    weights = [(64.0, 16.0, 4.0, 0.01)[i % 4] * (1.0 + (i % 7) / 7) for i in range(N_TENSORS)]
    scale = total / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    counts[0] += total - sum(counts)  # the first ("embedding") absorbs the remainder
    gen = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    for i, n in enumerate(counts):
        t = torch.randn(n, generator=gen, dtype=torch.float32)
        if n % 1024 == 0 and n >= 1024 * 16:
            t = t.view(n // 1024, 1024)
        kind = ("weight", "proj", "norm", "bias")[i % 4]
        state[f"layers.{i // 4}.{kind}.{i}"] = t
    return state


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


# --- page cache ----------------------------------------------------------------------------


@dataclass
class CacheDrop:
    """Drops the page cache between runs, and remembers what it could do."""

    fadvise_files: int = 0
    drop_caches_ok: bool | None = None
    drop_caches_error: str = ""

    def drop(self, root: Path) -> None:
        os.sync()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self.fadvise_files += 1
            finally:
                os.close(fd)
        if self.drop_caches_ok is False:
            return
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            self.drop_caches_ok = True
        except OSError as exc:
            self.drop_caches_ok = False
            self.drop_caches_error = f"{type(exc).__name__}: {exc.strerror or exc}"

    def describe(self) -> str:
        parts = [
            "`posix_fadvise(POSIX_FADV_DONTNEED)` after `fsync` on every file before each load",
        ]
        if self.drop_caches_ok:
            parts.append("`echo 3 > /proc/sys/vm/drop_caches` before each load (permitted)")
        elif self.drop_caches_ok is False:
            parts.append(
                f"`/proc/sys/vm/drop_caches` **not permitted** ({self.drop_caches_error}): "
                "cold loads rely on fadvise only"
            )
        return "; ".join(parts)


# --- measurements --------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    kind: str  # "save", "load", "copy"
    times: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fsync_path(path)


class Bench:
    def __init__(self, state: dict[str, torch.Tensor], root: Path, repeats: int) -> None:
        self.state = state
        self.root = root
        self.repeats = repeats
        self.cache = CacheDrop()
        self.results: list[Result] = []
        self.template = {k: torch.zeros_like(v) for k, v in state.items()}
        self.direct_ok: bool | None = None

    def fresh(self, name: str) -> Path:
        path = self.root / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def timed(self, fn: Callable[[], object]) -> float:
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - t0
        del out
        return elapsed

    def pair(
        self,
        save_name: str,
        save: Callable[[Path], object],
        loads: list[tuple[str, Callable[[Path], object]]],
        advance: Callable[[], None],
        save_note: str = "",
    ) -> None:
        """Run ``save`` ``repeats`` times in fresh dirs, then each load on the last one."""
        res = Result(save_name, "save", note=save_note)
        last: Path | None = None
        for r in range(self.repeats):
            if last is not None:
                shutil.rmtree(last)
            last = self.fresh(f"{save_name.split(maxsplit=1)[0]}-{r}")
            os.sync()
            res.times.append(self.timed(lambda d=last: save(d)))
            advance()
        self.results.append(res)
        assert last is not None
        for load_name, load in loads:
            lres = Result(load_name, "load")
            for _ in range(self.repeats):
                self.cache.drop(last)
                lres.times.append(self.timed(lambda d=last, fn=load: fn(d)))
                advance()
            self.results.append(lres)
        shutil.rmtree(last)

    # --- peers ---

    def memcpy(self, advance: Callable[[], None]) -> None:
        res = Result("memcpy (clone every tensor)", "copy", note="reference for stall")
        for _ in range(self.repeats):
            res.times.append(self.timed(lambda: {k: v.clone() for k, v in self.state.items()}))
            advance()
        self.results.append(res)

    def torch_save(self, d: Path) -> None:
        path = d / "state.pt"
        with open(path, "wb") as f:
            torch.save(self.state, f)
            f.flush()
            os.fsync(f.fileno())

    def torch_load(self, d: Path) -> object:
        return torch.load(d / "state.pt", weights_only=True)

    def st_save(self, d: Path) -> None:
        path = d / "state.safetensors"
        safetensors.torch.save_file(self.state, str(path))
        fsync_path(path)

    def st_load(self, d: Path) -> object:
        return safetensors.torch.load_file(str(d / "state.safetensors"))

    def dcp_save(self, d: Path) -> None:
        dcp.save(self.state, storage_writer=dcp.FileSystemWriter(str(d), thread_count=4))

    def dcp_load(self, d: Path) -> object:
        dcp.load(self.template, storage_reader=dcp.FileSystemReader(str(d)))
        return None

    # --- the disk's limit ---

    def _open_write(self, path: Path) -> tuple[int, bool]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if self.direct_ok is not False and hasattr(os, "O_DIRECT"):
            try:
                return os.open(path, flags | os.O_DIRECT, 0o644), True
            except OSError:
                self.direct_ok = False
        return os.open(path, flags, 0o644), False

    def raw_write(self, d: Path) -> None:
        path = d / "raw.bin"
        buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
        dst = torch.frombuffer(buf, dtype=torch.uint8)
        fd, direct = self._open_write(path)
        try:
            fill = 0
            total = 0

            def flush(n: int) -> None:
                nonlocal fd, direct
                padded = -(-n // 4096) * 4096 if direct else n
                view = memoryview(buf)[:padded]
                try:
                    written = os.write(fd, view)
                except OSError:
                    if not direct:
                        raise
                    # O_DIRECT refused at write time: reopen buffered, start over.
                    raise _DirectRefusedError from None
                assert written == padded, (written, padded)
                view.release()

            for t in self.state.values():
                src = t.reshape(-1).view(torch.uint8)
                pos, n = 0, src.numel()
                while pos < n:
                    take = min(CHUNK - fill, n - pos)
                    dst[fill : fill + take].copy_(src[pos : pos + take])
                    fill += take
                    pos += take
                    if fill == CHUNK:
                        flush(fill)
                        total += fill
                        fill = 0
            if fill:
                flush(fill)
                total += fill
            if direct:
                os.ftruncate(fd, total)
            os.fsync(fd)
            self.direct_ok = direct
        except _DirectRefusedError:
            os.close(fd)
            fd = -1
            self.direct_ok = False
            del dst
            buf.close()
            self.raw_write(d)
            return
        finally:
            if fd >= 0:
                os.close(fd)
        fsync_dir(d)
        del dst
        buf.close()

    def raw_read(self, d: Path) -> int:
        path = d / "raw.bin"
        flags = os.O_RDONLY
        if self.direct_ok:
            flags |= os.O_DIRECT
        buf = mmap.mmap(-1, CHUNK)
        fd = os.open(path, flags)
        total = 0
        try:
            while n := os.readv(fd, [buf]):
                total += n
        finally:
            os.close(fd)
            buf.close()
        return total

    # --- mouthguard ---

    def mg_save(self, d: Path, *, with_sha256: bool = False) -> None:
        store = mouthguard.Store([LocalTier(d, name="fast", domain="a")])
        ckpt = mouthguard.Checkpointer(store, "bench", with_sha256=with_sha256, background=False)
        ckpt.save(1, self.state)

    def mg_load(self, d: Path, *, into: bool = False) -> object:
        store = mouthguard.Store([LocalTier(d, name="fast", domain="a")])
        ckpt = mouthguard.Checkpointer(store, "bench", background=False)
        return ckpt.load(into=self.template if into else None).state


class _DirectRefusedError(Exception):
    pass


def check_equal(a: dict[str, torch.Tensor], b: object, what: str) -> None:
    assert isinstance(b, dict), what
    for k, v in a.items():
        if not torch.equal(v, b[k]):
            raise AssertionError(f"{what}: {k} differs")


def run_size(nbytes: int, root: Path, repeats: int, progress: Progress) -> tuple[Bench, float]:
    label = size_label(nbytes)
    task = progress.add_task(f"{label}: building state", total=None)
    state = build_state(nbytes)
    bench = Bench(state, root, repeats)
    # memcpy + 5 save/load families (mouthguard: 2 saves, 2 loads after the first)
    steps = repeats * (1 + 2 + 2 + 2 + 2 + 3 + 1)
    progress.update(task, total=steps, completed=0)

    def step(desc: str) -> Callable[[], None]:
        progress.update(task, description=f"{label}: {desc}")
        return lambda: progress.advance(task)

    t0 = time.perf_counter()
    bench.memcpy(step("memcpy"))
    bench.pair(
        "raw write + fsync",
        bench.raw_write,
        [("raw read", bench.raw_read)],
        step("raw O_DIRECT write/read"),
    )
    direct = "O_DIRECT" if bench.direct_ok else "buffered, O_DIRECT refused"
    for r in bench.results:
        if r.name.startswith("raw"):
            r.name = f"{r.name} ({direct})"
    bench.pair(
        "torch.save + fsync",
        bench.torch_save,
        [("torch.load", bench.torch_load)],
        step("torch.save/load"),
    )
    bench.pair(
        "safetensors save_file + fsync",
        bench.st_save,
        [("safetensors load_file", bench.st_load)],
        step("safetensors"),
    )
    bench.pair(
        "DCP save (FileSystemWriter, 4 threads)",
        bench.dcp_save,
        [("DCP load (into preallocated)", bench.dcp_load)],
        step("torch.distributed.checkpoint"),
    )
    bench.pair(
        "mouthguard save",
        bench.mg_save,
        [
            ("mouthguard load (verified)", bench.mg_load),
            ("mouthguard load(into=...) (verified)", lambda d: bench.mg_load(d, into=True)),
        ],
        step("mouthguard"),
    )
    bench.pair(
        "mouthguard-sha256 save (with_sha256=True)",
        lambda d: bench.mg_save(d, with_sha256=True),
        [],
        step("mouthguard with_sha256"),
    )
    # Correctness spot-check (not timed): every path must give back the same bytes.
    check_equal(state, bench.template, "DCP/mouthguard load(into=...)")
    elapsed = time.perf_counter() - t0
    progress.update(task, description=f"{label}: done", completed=steps)
    return bench, elapsed


# --- report --------------------------------------------------------------------------------


def find(results: list[Result], prefix: str) -> Result:
    for r in results:
        if r.name.startswith(prefix):
            return r
    raise KeyError(prefix)


def gibs(nbytes: int, seconds: float) -> float:
    return nbytes / GIB / seconds


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def report_size(bench: Bench, elapsed: float) -> tuple[list[str], Table]:
    nbytes = state_nbytes(bench.state)
    res = bench.results
    ref = {
        "save": (find(res, "DCP save").median, find(res, "raw write").median),
        "load": (find(res, "DCP load").median, find(res, "raw read").median),
    }
    lines = [
        f"## {size_label(nbytes)} state ({nbytes / GIB:.3f} GiB fp32, "
        f"{len(bench.state)} tensors, {bench.repeats} repeats, {elapsed:.0f} s)",
        "",
        "Ratios are throughput ratios (higher is faster): a save against DCP save and the",
        "raw write, a load against DCP load and the raw read.",
        "",
        "| operation | median s | min-max s | GiB/s | x DCP | x raw |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    table = Table(title=f"{size_label(nbytes)} state")
    for col in ("operation", "median s", "min-max s", "GiB/s", "x DCP", "x raw"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for r in res:
        med = r.median
        if r.kind in ref:
            dcp_t, raw_t = ref[r.kind]
            x_dcp, x_raw = f"{dcp_t / med:.2f}", f"{raw_t / med:.2f}"
        else:
            x_dcp = x_raw = "-"
        name = r.name + (f" — {r.note}" if r.note else "")
        row = [
            name,
            f"{med:.3f}",
            f"{min(r.times):.3f}-{max(r.times):.3f}",
            f"{gibs(nbytes, med):.2f}",
            x_dcp,
            x_raw,
        ]
        lines.append("| " + " | ".join(row) + " |")
        table.add_row(*row)

    mg_save = find(res, "mouthguard save").median
    mg_sha = find(res, "mouthguard-sha256").median
    mg_load = find(res, "mouthguard load (verified)").median
    mg_into = find(res, "mouthguard load(into").median
    st_save = find(res, "safetensors save_file").median
    st_load = find(res, "safetensors load_file").median
    dcp_save, raw_write = ref["save"]
    dcp_load, _ = ref["load"]
    best_load = min(mg_load, mg_into)
    x_dcp_save, x_raw_save = dcp_save / mg_save, raw_write / mg_save
    x_st_load, x_dcp_load = st_load / best_load, dcp_load / best_load
    ck_raw, ck_st, ck_sha = mg_save / raw_write, mg_save / st_save, mg_sha / mg_save
    raw_kind = "O_DIRECT" if bench.direct_ok else "buffered+fsync (O_DIRECT refused)"
    lines += [
        "",
        "### Targets (DESIGN.md, “Performance targets”)",
        "",
        "| target | goal | measured | verdict |",
        "|---|---|---|---|",
        f"| durable sync save vs DCP | ≥ 1.0x | {x_dcp_save:.2f}x | {verdict(x_dcp_save >= 1.0)} |",
        f"| durable sync save vs raw {raw_kind} write | ≥ 0.8x | {x_raw_save:.2f}x "
        f"| {verdict(x_raw_save >= 0.8)} |",
        f"| cold load vs safetensors `load_file` | ≥ 1.0x | {x_st_load:.2f}x "
        f"(best mouthguard load: {'into=' if mg_into <= mg_load else 'plain'}) "
        f"| {verdict(x_st_load >= 1.0)} |",
        f"| cold load vs DCP load | ≥ 2.0x | {x_dcp_load:.2f}x | {verdict(x_dcp_load >= 2.0)} |",
        f"| checksum cost: mouthguard save time / raw write time of the same bytes | ≤ 1.1x "
        f"| {ck_raw:.2f}x | {verdict(ck_raw <= 1.1)} |",
        f"| (for context) mouthguard save time / safetensors save_file + fsync | ≤ 1.1x "
        f"| {ck_st:.2f}x | {verdict(ck_st <= 1.1)} |",
        f"| (for context) with_sha256 save / default save | - | {ck_sha:.2f}x | - |",
        "| async save stall ≤ 2x memcpy, ≤ 1/3 DCP `async_save` | - | - "
        "| not implemented yet (issue: async saves, O_DIRECT write path) |",
        "| memory: peak RSS ≤ state + one staging copy + 256 MiB; no growth over 20 saves | - "
        "| - | not implemented yet (issue: async saves, O_DIRECT write path) |",
        "| multi-rank: world_size + 1 files per checkpoint, throughput at scale | - | - "
        "| not implemented yet (issue: async saves, O_DIRECT write path) |",
        "",
        "mouthguard has no unverified save, so the checksum cost is measured against the",
        "raw write of the same bytes (an upper bound: it also includes the format, the",
        "manifest and the commit's directory fsyncs).",
        "",
    ]
    return lines, table


def machine_line(root: Path) -> str:
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
        fs = f"{out[1]} ({out[0]}, mounted on {out[-1]})"
    return (
        f"Machine: {os.cpu_count()} CPUs ({cpu}), {mem} memory; filesystem of the benchmark "
        f"directory: {fs}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"safetensors {safetensors.__version__}, mouthguard {mouthguard.__version__}; "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC."
    )


def default_root() -> Path:
    """A temp dir on the repo's filesystem: /tmp if it shares it, else next to the repo."""
    tmp = Path(tempfile.gettempdir())
    base = tmp if tmp.stat().st_dev == REPO.stat().st_dev else REPO
    return Path(tempfile.mkdtemp(prefix=".mouthguard-bench-", dir=base))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--sizes", default="256M", help="comma-separated, e.g. 256M,2G")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.repeats < 1 or not sizes:
        parser.error("need at least one size and one repeat")

    owned = args.dir is None
    root = default_root() if owned else args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    cmd = [".venv/bin/python", "-m", "benchmarks.run", "--sizes", args.sizes]
    cmd += ["--repeats", str(args.repeats)]
    if not owned:
        cmd += ["--dir", str(args.dir)]
    out_default = REPO / "docs" / "benchmarks.md"
    if args.out.resolve() != out_default:
        cmd += ["--out", str(args.out)]

    machine = machine_line(root)
    sections: list[str] = []
    caches: list[CacheDrop] = []
    started = time.perf_counter()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            for nbytes in sizes:
                bench, elapsed = run_size(nbytes, root, args.repeats, progress)
                lines, table = report_size(bench, elapsed)
                sections += lines
                caches.append(bench.cache)
                progress.console.print(table)
                del bench
                gc.collect()
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - started

    doc = [
        "# Benchmarks",
        "",
        "Generated by `benchmarks/run.py` (see `benchmarks/README.md`); do not edit by hand.",
        "",
        machine,
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        shlex.join(cmd),
        "```",
        "",
        f"Total runtime: {total:.0f} s. Page cache between loads: {caches[0].describe()}.",
        "All saves are durable (file `fsync`; DCP uses its own `sync_files=True`); every",
        "repeat writes a fresh directory. The raw write copies the tensors into an aligned",
        "8 MiB buffer and writes it sequentially; the raw read reads into that buffer only.",
        "",
        *sections,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(doc).rstrip() + "\n")
    console.print(f"wrote {args.out} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
