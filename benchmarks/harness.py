"""Timing plumbing shared by every measurement: results, fresh dirs, cold page cache."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


def progress_bar(console: Console) -> Progress:
    """The benchmarks' rich progress bar: what runs, a bar, done/total, time elapsed."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    )


class Ticker(Protocol):
    """What the harness tells the progress bar."""

    def stage(self, desc: str) -> None: ...

    def tick(self) -> None: ...


class NullTicker:
    def stage(self, desc: str) -> None:
        pass

    def tick(self) -> None:
        pass


#: The note of a first-save row: measured once per run, one-time setup included.
FIRST_NOTE = "measured once: the run's first call, one-time setup included"


@dataclass
class Result:
    """One table row: the timings of one operation, or why it could not be measured."""

    name: str
    kind: str  # "copy", "save", "load", "first stall", "stall", "async" (report.REFERENCES)
    times: list[float] = field(default_factory=list)
    note: str = ""
    unavailable: str = ""  # non-empty: "not available" and why

    @property
    def ok(self) -> bool:
        return not self.unavailable and bool(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


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


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes, after a garbage collection (its result is dropped untimed)."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t0
    del out
    return elapsed


def paged_in(loaded: object) -> object:
    """Read one byte of every 4 KiB page of the tensors ``loaded`` holds; return it.

    A load is timed until its bytes are in memory: a loader that maps the file
    lazily (safetensors' ``load_file`` does) would otherwise be timed without
    reading anything. Pages already resident cost almost nothing.
    """
    if isinstance(loaded, dict):
        for t in loaded.values():
            if isinstance(t, torch.Tensor) and t.numel():
                t.reshape(-1).view(torch.uint8)[::4096].max()
    return loaded


def _load_paged_in(load: Callable[[Path], object], where: Path) -> object:
    return paged_in(load(where))


class Harness:
    """Runs operations ``repeats`` times on one state under ``root`` and collects rows."""

    def __init__(
        self,
        state: dict[str, torch.Tensor],
        root: Path,
        repeats: int,
        ticker: Ticker | None = None,
    ) -> None:
        self.state = state
        self.root = root
        self.repeats = repeats
        self.ticker: Ticker = ticker or NullTicker()
        self.cache = CacheDrop()
        self.results: list[Result] = []
        #: Loads registered by :meth:`loads`, timed by :meth:`run_loads`.
        self._pending: list[tuple[Path, list[tuple[Result, Callable[[Path], object]]], bool]] = []

    def fresh(self, name: str) -> Path:
        path = self.root / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def add(self, result: Result) -> Result:
        self.results.append(result)
        return result

    def repeat(self, name: str, kind: str, fn: Callable[[], object], note: str = "") -> Result:
        res = Result(name, kind, note=note)
        for _ in range(self.repeats):
            res.times.append(timed(fn))
            self.ticker.tick()
        return self.add(res)

    def saves(
        self, names: list[tuple[str, str]], saves: list[Callable[[Path], object]]
    ) -> dict[str, Path]:
        """Time each save ``repeats`` times, interleaved, every repeat in a fresh dir.

        ``names`` holds (row name, note) per save. Interleaving (a, b, a, b, ...)
        spreads the disk's drift over every row compared. Returns the directory of
        each save's last repeat (kept for the loads); earlier ones are removed.
        """
        rows = [Result(name, "save", note=note) for name, note in names]
        last: dict[str, Path] = {}
        for r in range(self.repeats):
            for i, (res, save) in enumerate(zip(rows, saves, strict=True)):
                if res.name in last:
                    shutil.rmtree(last[res.name])
                d = last[res.name] = self.fresh(f"{_slug(res.name)}-{i}-{r}")
                os.sync()
                res.times.append(timed(functools.partial(save, d)))
                self.ticker.tick()
        for res in rows:
            self.add(res)
        return last

    def loads(
        self, where: Path, loads: list[tuple[str, Callable[[Path], object]]], *, remove: bool
    ) -> None:
        """Register cold loads of ``where``; :meth:`run_loads` times them all, interleaved.

        Each row is added now (the table keeps its order) and timed later, so that
        every load of the run shares the disk's drift: on a virtual disk the same
        read varies by 2x over minutes, which measured one peer after another turns
        into a ratio. ``remove``: delete ``where`` once the loads have run.
        """
        group = [(self.add(Result(name, "load")), load) for name, load in loads]
        self._pending.append((where, group, remove))

    def run_loads(self) -> None:
        """Time every registered load ``repeats`` times, round-robin, page cache dropped first.

        Repeat r runs the loads in registration order rotated by r, so no load is
        always the first after a save or always the last; then the directories
        registered with ``remove`` are deleted.
        """
        order = [(where, res, load) for where, group, _ in self._pending for res, load in group]
        for r in range(self.repeats):
            shift = r % len(order) if order else 0
            for where, res, load in order[shift:] + order[:shift]:
                self.cache.drop(where)
                res.times.append(timed(functools.partial(_load_paged_in, load, where)))
                self.ticker.tick()
        for where, _, remove in self._pending:
            if remove:
                shutil.rmtree(where)
        self._pending.clear()

    def pair(
        self,
        save_name: str,
        save: Callable[[Path], object],
        loads: list[tuple[str, Callable[[Path], object]]],
        save_note: str = "",
    ) -> None:
        """Time ``save`` in fresh dirs; register each load on the last one (removed after)."""
        last = self.saves([(save_name, save_note)], [save])[save_name]
        if loads:
            self.loads(last, loads, remove=True)
        else:
            shutil.rmtree(last)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.split(" (", 1)[0])[:40]
