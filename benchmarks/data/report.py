"""The markdown report: setup, one table per source x cache state x workers, stalls, targets."""

from __future__ import annotations

import importlib.metadata
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from rich.table import Table

import benchmarks.report
from benchmarks.data import config
from benchmarks.data.config import CellResult, Epoch
from benchmarks.data.report_prose import (
    FIGURES_TEXT,
    FLOOR_MARGIN_MS,
    NOTES_TEXT,
    THROUGHPUT_GOAL,
    processes_line,
    s3_line,
    stall_text,
    targets_text,
    workers_line,
)

PACKAGES = ("torch", "webdataset", "mosaicml-streaming", "litdata", "mouthguard")
STATES = ("cold", "warm")
MB = 1e6


@dataclass
class SetupRow:
    """Writing or uploading one reader's copy of the dataset."""

    what: str  # "write" or "upload"
    reader: str
    seconds: float
    files: int
    nbytes: int
    unavailable: str = ""


@dataclass
class RunInfo:
    """What the report says about the run as a whole."""

    machine: str
    command: str
    seconds: float
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    samples: int
    sample_size: int
    shard_size: int
    batch_size: int
    step_ms: float
    repeats: int
    cache: str
    opens_problem: str | None
    s3_problem: str
    server: str
    sources: list[str]
    stall_workers: list[int] = field(default_factory=list)
    #: The delay the loopback proxy added to every S3 request of the cells (0: none).
    s3_latency_ms: float = 0.0
    #: Every reader's DataLoader kept its workers across epochs (``--persistent-workers``).
    persistent_workers: bool = False
    #: Every child was forked from a process that had imported torch (``--preloaded-children``).
    preloaded_children: bool = False
    #: Put before every table title when one run measures several sample sizes.
    label: str = ""


@dataclass
class Part:
    """One sample size's measurements: its run figures, its setup rows, its cells."""

    info: RunInfo
    setup: list[SetupRow]
    results: list[CellResult]


def machine_line(root: Path) -> str:
    """CPUs, memory, the benchmark directory's filesystem, the loaders' versions, date."""
    versions = ", ".join(f"{p} {_version(p)}" for p in PACKAGES)
    return benchmarks.report.machine_line(root, versions)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Row:
    """One reader's epochs in one table (several when repeated) or why there are none."""

    reader: str
    epochs: list[Epoch]
    unavailable: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.epochs) and not self.unavailable

    @property
    def median(self) -> Epoch:
        """The repeat with the median time (the lower one of an even count)."""
        ordered = sorted(self.epochs, key=lambda e: e.seconds)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def rate(self) -> float:
        e = self.median
        return e.samples / e.seconds


def rows_for(
    results: list[CellResult], source: str, workers: int, mode: str, state: str
) -> list[Row]:
    """One :class:`Row` per reader measured in this table, in :data:`config.READERS` order."""
    rows = []
    for reader in config.READERS:
        cells = [
            r
            for r in results
            if (r.reader, r.source, r.workers, r.mode) == (reader, source, workers, mode)
        ]
        if not cells:
            continue
        epochs = [e for c in cells for e in c.epochs if e.state == state]
        why = next((c.unavailable for c in cells if c.unavailable), "")
        if not epochs and not why:
            why = "no epoch was recorded"
        notes = "; ".join(dict.fromkeys(c.note for c in cells if c.note))
        rows.append(Row(reader, epochs, why, notes))
    return rows


def best_peer(rows: list[Row]) -> Row | None:
    """The fastest row that is neither mouthguard's nor the floor."""
    peers = [
        r
        for r in rows
        if r.ok and r.reader not in config.MOUTHGUARDS and r.reader not in config.REFERENCE
    ]
    return max(peers, key=lambda r: r.rate, default=None)


def _opens(e: Epoch) -> tuple[str, str, str]:
    if e.opens_data is None or e.opens_all is None:
        return "-", "-", "-"
    return f"{e.opens_data / e.samples:.3f}", f"{e.opens_data / e.seconds:.0f}", str(e.opens_all)


THROUGHPUT_COLUMNS = (
    "reader",
    "samples/s",
    "MB/s",
    "x best peer",
    "epoch s",
    "data files opened / sample",
    "data files opened / s",
    "all opens",
    "GETs (all requests)",
    "load 1-min before→after",
    "CPU s (loader / S3 server / machine busy)",
)


def _cpu(e: Epoch) -> str:
    """The epoch's CPU sums (benchmarks.data.cpu), '-' where not measured."""
    if e.cpu_loader_s is None:
        return "-"
    server = "-" if e.cpu_server_s is None else f"{e.cpu_server_s:.2f}"
    busy = "-"
    if e.cpu_machine_s is not None and e.cpus and e.seconds > 0:
        busy = f"{100 * e.cpu_machine_s / (e.seconds * e.cpus):.0f}% of {e.cpus}"
    return f"{e.cpu_loader_s:.2f} / {server} / {busy}"


def throughput_cells(row: Row, best: Row | None) -> list[str]:
    label = config.LABELS[row.reader]
    if not row.ok:
        return [f"{label} — **not available**: {row.unavailable}"] + ["-"] * (
            len(THROUGHPUT_COLUMNS) - 1
        )
    e = row.median
    spread = ""
    if len(row.epochs) > 1:
        times = [x.seconds for x in row.epochs]
        spread = f" ({min(times):.2f}-{max(times):.2f})"
    ratio = "-" if best is None or row.reader in config.REFERENCE else f"{row.rate / best.rate:.2f}"
    if best is not None and row.reader == best.reader:
        ratio = "1.00 (best peer)"
    gets = "-" if e.gets is None else f"{e.gets} ({e.requests})"
    per_sample, per_s, total = _opens(e)
    note = f" — {row.note}" if row.note else ""
    return [
        f"{label}{note}",
        f"{row.rate:.0f}",
        f"{e.payload_bytes / MB / e.seconds:.0f}",
        ratio,
        f"{e.seconds:.2f}{spread}",
        per_sample,
        per_s,
        total,
        gets,
        f"{e.load_before:.2f}→{e.load_after:.2f}",
        _cpu(e),
    ]


STALL_COLUMNS = (
    "reader",
    "workers",
    "cold: first batch ms",
    "cold: p50 / p99 / max ms",
    "cold: all waits ms",
    "warm: first batch ms",
    "warm: p50 / p99 / max ms",
    "warm: all waits ms",
    "load 1-min (cold, warm)",
)


def _stall(e: Epoch | None) -> tuple[str, str, str]:
    """First batch, p50 / p99 / max of the rest, and every wait summed (the first's too), in ms."""
    if e is None or not e.waits:
        return "-", "-", "-"
    rest = e.waits[1:] or e.waits
    ms = [w * 1000 for w in rest]
    return (
        f"{e.waits[0] * 1000:.0f}",
        f"{percentile(ms, 50):.2f} / {percentile(ms, 99):.2f} / {max(ms):.1f}",
        f"{sum(e.waits) * 1000:.0f}",
    )


def stall_cells(cell: CellResult) -> list[str]:
    label = config.LABELS[cell.reader]
    if cell.unavailable or not cell.epochs:
        return [f"{label} — **not available**: {cell.unavailable or 'no epoch'}", str(cell.workers)]
    cold, warm = cell.epoch("cold"), cell.epoch("warm")
    loads = ", ".join(
        f"{e.load_before:.2f}→{e.load_after:.2f}" for e in (cold, warm) if e is not None
    )
    return [label, str(cell.workers), *_stall(cold), *_stall(warm), loads]


class Doc:
    """Markdown lines and the rich tables printed at the end of the run."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.tables: list[Table] = []

    def table(self, title: str, columns: Sequence[str], rows: list[list[str]]) -> None:
        self.lines += [_row(*columns), "|---|" + "---:|" * (len(columns) - 1)]
        rich = Table(title=title)
        for col in columns:
            rich.add_column(col)
        for given in rows:
            cells = given + ["-"] * (len(columns) - len(given))
            self.lines.append(_row(*cells))
            rich.add_row(*cells)
        self.lines.append("")
        self.tables.append(rich)


def _throughput_sections(
    doc: Doc, info: RunInfo, results: list[CellResult], targets: list[str]
) -> None:
    workers = sorted({r.workers for r in results if r.mode == "throughput"})
    for source in info.sources:
        for state in STATES:
            for w in workers:
                rows = rows_for(results, source, w, "throughput", state)
                if not rows:
                    continue
                best = best_peer(rows)
                title = f"{info.label}{source}, {state}, {w} worker{'s' * (w != 1)}"
                doc.lines += [f"### {title}", ""]
                if best is not None:
                    doc.lines += [f"Best peer: {config.LABELS[best.reader]}.", ""]
                doc.table(title, THROUGHPUT_COLUMNS, [throughput_cells(r, best) for r in rows])
                targets.extend(
                    _throughput_target(title, row, best)
                    for row in rows
                    if row.reader in config.MOUTHGUARDS
                )


def _throughput_target(title: str, row: Row, best: Row | None) -> str:
    name = f"{title}: {config.LABELS[row.reader]} / best peer samples/s"
    goal = f"≥ {THROUGHPUT_GOAL:.1f}x"
    if not row.ok:
        return _row(name, goal, "-", f"not available ({row.unavailable})")
    if best is None:
        return _row(name, goal, "-", "not available (no peer measured)")
    x = row.rate / best.rate
    return _row(name, goal, f"{x:.2f}x ({config.LABELS[best.reader]})", verdict(x >= 1.0))


def _p99_ms(e: Epoch | None) -> float | None:
    """The 99th percentile of an epoch's waits after the first, in ms (None: not measured)."""
    if e is None or len(e.waits) < 2:
        return None
    return percentile([w * 1000 for w in e.waits[1:]], 99)


def _first_ms(e: Epoch | None) -> float | None:
    return None if e is None or not e.waits else e.waits[0] * 1000


def _median_of(
    cells: list[CellResult], state: str, measure: Callable[[Epoch | None], float | None]
) -> float | None:
    """The median over repeats of ``measure`` of the cells' ``state`` epochs (None: none)."""
    values = [v for c in cells if not c.unavailable and (v := measure(c.epoch(state))) is not None]
    return median(values) if values else None


def _best_peer(
    cells: list[CellResult], state: str, measure: Callable[[Epoch | None], float | None]
) -> tuple[float, str] | None:
    """The peers' lowest median ``measure`` (with the peer's label), None if no peer measured it."""
    found = []
    for reader in {c.reader for c in cells} - set(config.MOUTHGUARDS) - set(config.REFERENCE):
        value = _median_of([c for c in cells if c.reader == reader], state, measure)
        if value is not None:
            found.append((value, config.LABELS[reader]))
    return min(found, default=None)


#: One stall verdict to judge: state, what, mouthguard's value, its limit, what the limit is.
_Check = tuple[str, str, float | None, float | None, str]


def _cold_against_peers(
    own: list[CellResult],
    group: list[CellResult],
    what: str,
    measure: Callable[[Epoch | None], float | None],
    against: str,
) -> _Check:
    """mouthguard's cold ``measure`` against the peers' lowest in the same table."""
    peer = _best_peer(group, "cold", measure)
    limit = None if peer is None else peer[0]
    named = against if peer is None else f"{against} ({peer[1]})"
    return ("cold", what, _median_of(own, "cold", measure), limit, named)


def _stall_targets(label: str, source: str, cells: list[CellResult]) -> list[str]:
    """The stall verdicts in the dataset targets' terms, per mouthguard reader and worker count.

    warm: p99 at most the in-memory floor's (the DataLoader alone, same table) + 1 ms;
    cold: p99 at most the lowest of the peers'; on S3 the cold first batch at most the
    fastest peer's. With repeats, each reader's median over them.
    """
    rows: list[str] = []
    for workers in sorted({c.workers for c in cells}):
        group = [c for c in cells if c.workers == workers]
        floor = _median_of([c for c in group if c.reader in config.REFERENCE], "warm", _p99_ms)
        for reader in [r for r in config.MOUTHGUARDS if any(c.reader == r for c in group)]:
            own = [c for c in group if c.reader == reader]
            name = f"{label}stall, {source}, %s, {workers} workers: {config.LABELS[reader]} %s"
            checks: list[_Check] = [
                ("warm", "p99 wait per step", _median_of(own, "warm", _p99_ms),
                 None if floor is None else floor + FLOOR_MARGIN_MS,
                 f"the in-memory floor's p99 + {FLOOR_MARGIN_MS:g} ms"),
                _cold_against_peers(
                    own, group, "p99 wait per step", _p99_ms, "the lowest peer p99"
                ),
            ]  # fmt: skip
            if source == "s3":
                checks.append(
                    _cold_against_peers(own, group, "first batch", _first_ms, "the fastest peer's")
                )
            for state, what, value, limit, against in checks:
                title = name % (state, what)
                if value is None:
                    rows.append(_row(title, f"≤ {against}", "-", "not available (not measured)"))
                elif limit is None:
                    why = "no floor measured" if state == "warm" else "no peer measured"
                    rows.append(
                        _row(title, f"≤ {against}", f"{value:.2f} ms", f"not available ({why})")
                    )
                else:
                    goal = f"≤ {against}: {limit:.2f} ms"
                    rows.append(_row(title, goal, f"{value:.2f} ms", verdict(value <= limit)))
    return rows


def _stall_sections(doc: Doc, info: RunInfo, results: list[CellResult], targets: list[str]) -> None:
    for source in info.sources:
        cells = [r for r in results if r.mode == "stall" and r.source == source]
        if not cells:
            continue
        cells.sort(key=lambda c: (c.workers, config.READERS.index(c.reader)))
        doc.lines += [f"### {info.label}Stall at a {info.step_ms:.0f} ms step: {source}", ""]
        doc.table(f"{info.label}stall, {source}", STALL_COLUMNS, [stall_cells(c) for c in cells])
        targets.extend(_stall_targets(info.label, source, cells))


def _suffix(info: RunInfo) -> str:
    """`` (10K samples)`` after a section's heading when the run has several sample sizes."""
    return f" ({info.label.removesuffix(': ')})" if info.label else ""


def _setup_section(info: RunInfo, setup: list[SetupRow]) -> list[str]:
    lines = [
        f"## The dataset{_suffix(info)}",
        "",
        f"{info.samples} samples of {info.sample_size} bytes "
        f"({info.samples * info.sample_size / 2**30:.2f} GiB of payload), keys `s00000000`, ...; "
        "each payload is random bytes from a generator seeded by the sample's number, so "
        "every format holds the same, incompressible bytes. Shards (chunks) are cut at "
        f"{info.shard_size / 2**20:.0f} MiB in every format; batches of {info.batch_size}.",
        "",
        "| step | reader | seconds | files | MiB | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for s in setup:
        size = f"{s.nbytes / 2**20:.0f}" if s.nbytes else "-"
        files = str(s.files) if s.files else "-"
        note = f"**not available**: {s.unavailable}" if s.unavailable else ""
        lines.append(_row(s.what, config.LABELS[s.reader], f"{s.seconds:.1f}", files, size, note))
    return [*lines, ""]


def _body(part: Part) -> tuple[list[str], list[Table]]:
    """One sample size's sections: its dataset, throughput and stall tables, verdicts."""
    info = part.info
    doc = Doc()
    targets = ["| target | goal | measured | verdict |", "|---|---|---|---|"]
    _throughput_sections(doc, info, part.results, targets)
    throughput = doc.lines
    doc.lines = []
    _stall_sections(doc, info, part.results, targets)
    stalls = doc.lines
    suffix = _suffix(info)
    lines = [
        *_setup_section(info, part.setup),
        f"## Throughput{suffix}",
        "",
        *throughput,
        f"## Training-step stall{suffix}",
        "",
        *stall_text(info),
        "",
        *stalls,
        f"## Targets: verdicts{suffix}",
        "",
        *targets,
        "",
    ]
    return lines, doc.tables


def document(run: RunInfo, parts: Sequence[Part]) -> tuple[str, list[Table]]:
    """The report's markdown, and the rich tables to print.

    ``run`` holds what is said once (machine, command, runtime, load, S3 server);
    each of ``parts`` (one per sample size, in order) gets its own sections.
    """
    info = run
    load = " / ".join(f"{x:.2f}" for x in info.load_start)
    load_end = " / ".join(f"{x:.2f}" for x in info.load_end)
    opens_how = (
        "`perf stat` on the open tracepoints (see below)"
        if info.opens_problem is None
        else f"**not available**: {info.opens_problem}"
    )
    lines = [
        "# Dataset loader benchmarks",
        "",
        "Generated by `python -m benchmarks.data` (`benchmarks/data/`; see "
        "`benchmarks/README.md`, “Dataset loaders”); do not edit by hand.",
        "",
        info.machine,
        "",
        f"**Shared machine.** Whatever else runs on these {os.cpu_count()} CPUs counts in "
        "the load, and so do the benchmark's own processes (the cell, its workers, the S3 "
        f"server): load average (1 / 5 / 15 min) {load} at the start and {load_end} at the "
        "end; every row gives the 1-minute load before and after its epoch. Absolute "
        "figures on a small machine are low and noisy; compare rows of one table "
        "(measured minutes apart on the same disk), not runs.",
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        info.command,
        "```",
        "",
        f"Total runtime: {info.seconds:.0f} s. Page cache before every cold epoch: "
        f"{info.cache}. Files opened: {opens_how}. S3: {s3_line(info)}.",
        "",
        *targets_text(info),
        "",
        *FIGURES_TEXT,
        workers_line(info),
        processes_line(info),
        "",
    ]
    tables: list[Table] = []
    for part in parts:
        body, part_tables = _body(part)
        lines += body
        tables += part_tables
    lines += NOTES_TEXT
    return "\n".join(lines).rstrip() + "\n", tables
