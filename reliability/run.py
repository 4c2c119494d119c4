"""Run the reliability harnesses and write their table into ``docs/reliability.md``.

``python -m reliability.run [--level ci|soak] [--only NAME,...] [--out FILE] [--json-dir DIR]``

Each harness is a module ``reliability/<name>.py`` exposing
``run(level) -> HarnessResult`` (see :mod:`reliability.record`). A module that
does not exist yet, fails to import or has no ``run`` is reported as *not
available* -- it does not stop the others. A harness that raises is a failed
result. A harness that could not run (no server to test against) is *not run*,
with its reason: never a pass. Every result is written as JSON to
``--json-dir``, and the rows of the harnesses run replace theirs in the table
between ``<!-- harnesses:begin -->`` and ``<!-- harnesses:end -->`` of
``--out``; everything else in the file is kept byte for byte (rows of harnesses
not run this time stay as they were, brought to today's columns).

Each row shows the cases by kind, and beside the lost acknowledged saves the
acknowledged saves left out of that count and why; a never-event a harness does
not look for reads ``n/a``, not 0.

Exit status: 0 when every harness ran and passed; 1 when any failed; 3 when none
failed but at least one did not run or is not available (1 with ``--strict``);
2 on a usage error. Not running is not a failure of the code under test, but it
is not a pass either: the exit status says so.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from reliability.record import HarnessResult, Level, Status

ROOT = Path(__file__).resolve().parents[1]
#: Harness name -> module. The order is the table's.
REGISTRY: dict[str, str] = {
    "crash": "reliability.crash",
    "powerloss": "reliability.powerloss",
    "rankdeath": "reliability.rankdeath",
    "chaos": "reliability.chaos",
    "s3_faults": "reliability.s3_faults",
    "fuzz": "reliability.fuzz",
    "security": "reliability.security",
}
BEGIN = "<!-- harnesses:begin -->"
END = "<!-- harnesses:end -->"
HEADER = (
    "| harness | what was tried | cases, by kind | survived | accepted-corrupt "
    "| lost acknowledged saves | gone but not counted as lost, and why "
    "| writes outside the store | seconds | rerun |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
COLUMNS = HEADER.count("|", 0, HEADER.index("\n")) - 1
#: The column layout before cases were broken down and exclusions shown.
_OLD_COLUMNS = 9
_OLD_EXCLUDED_CELL = "not recorded (this row predates the column: rerun to see)"
EXIT_OK, EXIT_FAILED, EXIT_NOT_RUN = 0, 1, 3

HarnessRun = Callable[[Level], HarnessResult]


@dataclass
class Outcome:
    """One harness: its result, or why it is not available."""

    name: str
    result: HarnessResult | None = None
    unavailable: str | None = None

    @property
    def status(self) -> Status:
        """The result's status; a harness that is not available did not run."""
        return "not run" if self.result is None else self.result.status


def rerun_command(name: str, level: Level) -> str:
    """The runner command that reruns one harness."""
    return f".venv/bin/python -m reliability.run --level {level} --only {name}"


def load_harness(module: str) -> HarnessRun | str:
    """The module's ``run``, or why it is not available."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return "not written yet"
        return f"fails to import: {type(exc).__name__}: {exc}"
    except Exception as exc:
        return f"fails to import: {type(exc).__name__}: {exc}"
    run = getattr(loaded, "run", None)
    if not callable(run):
        return "has no run(level)"
    return cast("HarnessRun", run)


def run_harness(name: str, module: str, level: Level) -> Outcome:
    """Import and run one harness; a harness that raises is a failed result."""
    harness = load_harness(module)
    if isinstance(harness, str):
        return Outcome(name, unavailable=harness)
    started = time.monotonic()
    try:
        result = _checked(harness(level))
    except Exception as exc:
        result = HarnessResult(
            harness=name,
            what=f"the harness itself failed: {type(exc).__name__}: {exc}",
            cases=1,
            survived=0,
            command=rerun_command(name, level),
            seconds=round(time.monotonic() - started, 1),
            details={"error": traceback.format_exc()},
        )
    return Outcome(name, result=result)


def _checked(result: object) -> HarnessResult:
    if not isinstance(result, HarnessResult):
        raise TypeError(f"run() returned {type(result).__name__}, not HarnessResult")
    return result


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def cases_cell(result: HarnessResult) -> str:
    """The total, then what it is made of: ``"1,200: delays of 0.5 ms 900; ENOSPC 300"``."""
    total = f"{result.cases:,}"
    # Most frequent first, whatever order the result (or its JSON) holds them in.
    kinds = dict(sorted(result.cases_by_kind.items(), key=lambda item: (-item[1], item[0])))
    if not kinds:
        return total
    counts = set(kinds.values())
    if len(kinds) > 3 and len(counts) == 1:  # many kinds, equal shares: say it once
        return f"{total}: {len(kinds)} kinds, {counts.pop():,} each ({', '.join(kinds)})"
    return f"{total}: " + "; ".join(f"{kind} {n:,}" for kind, n in kinds.items())


def _never_event(result: HarnessResult, name: str, value: int) -> str:
    return "n/a" if name in result.not_measured else f"{value:,}"


def lost_cell(result: HarnessResult) -> str:
    """Lost acknowledged saves, out of how many acknowledged."""
    lost = _never_event(result, "lost_acknowledged", result.lost_acknowledged)
    if lost == "n/a" or result.acknowledged is None:
        return lost
    return f"{lost} of {result.acknowledged:,} acknowledged"


def excluded_cell(result: HarnessResult) -> str:
    """The acknowledged saves left out of "lost", by reason (``none`` when none)."""
    if "lost_acknowledged" in result.not_measured or result.acknowledged is None:
        return "-"
    parts = [f"{n:,} {reason}" for reason, n in result.excluded.items() if n]
    return "; ".join(parts) or "none"


def render_row(outcome: Outcome, level: Level) -> str:
    """One table row (``level`` is the level it ran at)."""
    name = f"`{outcome.name}`"
    result = outcome.result
    dash = "-"
    if result is None:
        cells = [
            f"{name} **NOT RUN**",
            f"not available ({_cell(outcome.unavailable or '')})",
            *[dash] * (COLUMNS - 3),
            f"`{rerun_command(outcome.name, level)}`",
        ]
    elif not result.ran:
        cells = [
            f"{name} ({level}) **NOT RUN**",
            _cell(f"not run: {result.not_run}"),
            *[dash] * (COLUMNS - 3),
            f"`{_cell(result.command or rerun_command(outcome.name, level))}`",
        ]
    else:
        verdict = "" if result.ok else " **FAILED**"
        cells = [
            f"{name} ({level}){verdict}",
            _cell(result.what),
            _cell(cases_cell(result)),
            f"{result.survived:,}",
            _never_event(result, "accepted_corrupt", result.accepted_corrupt),
            lost_cell(result),
            _cell(excluded_cell(result)),
            _never_event(result, "writes_outside", result.writes_outside),
            f"{result.seconds:.1f}",
            f"`{_cell(result.command or rerun_command(outcome.name, level))}`",
        ]
    return "| " + " | ".join(cells) + " |"


# A cell boundary: a "|" that the cell text did not escape.
_CELL_BOUNDARY = re.compile(r"(?<!\\)\|")


def _cells_of(row: str) -> list[str]:
    return [c.strip() for c in _CELL_BOUNDARY.split(row.strip().strip("|"))]


def _row_name(row: str) -> str | None:
    words = _cells_of(row)[0].split()
    return words[0].strip("`") if words else None


def upgrade_row(row: str) -> str:
    """A row kept from an earlier run, in today's columns.

    Rows written before cases were broken down and exclusions shown say that
    they did not record them, so an old total or "0 lost" never stands without
    its caveat.
    """
    cells = _cells_of(row)
    if len(cells) == _OLD_COLUMNS:
        cases = f"{cells[2]} (by kind: not recorded)"
        cells = [*cells[:2], cases, *cells[3:6], _OLD_EXCLUDED_CELL, *cells[6:]]
    return "| " + " | ".join(cells) + " |"


def existing_rows(section: str) -> dict[str, str]:
    """The rows already between the markers, by harness name (header lines skipped)."""
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith(("| harness |", "|---")):
            continue
        name = _row_name(line)
        if name:
            rows[name] = upgrade_row(line)
    return rows


def rewrite_section(text: str, rows: Mapping[str, str], order: Sequence[str]) -> str:
    """``text`` with the table between the markers rebuilt; all else byte-identical.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    begin = text.find(BEGIN)
    end = text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"markers {BEGIN} ... {END} not found (in this order)")
    inner_start = begin + len(BEGIN)
    merged = {**existing_rows(text[inner_start:end]), **rows}
    known = [n for n in order if n in merged] + sorted(set(merged) - set(order))
    table = "\n".join([HEADER, *(merged[n] for n in known)])
    return f"{text[:inner_start]}\n{table}\n{text[end:]}"


def _status(outcome: Outcome) -> str:
    result = outcome.result
    if result is None:
        return f"[yellow]not run: not available[/] ({outcome.unavailable})"
    if not result.ran:
        return f"[yellow]not run[/] ({result.not_run})"
    if result.ok:
        return f"[green]ok[/] {result.survived}/{result.cases} survived"
    return (
        f"[red]FAILED[/] {result.survived}/{result.cases} survived, "
        f"{result.accepted_corrupt} accepted-corrupt, {result.lost_acknowledged} lost, "
        f"{result.writes_outside} outside"
    )


def main(argv: Sequence[str] | None = None, *, registry: Mapping[str, str] | None = None) -> int:
    """Run the harnesses; see the module docstring."""
    registry = REGISTRY if registry is None else registry
    parser = argparse.ArgumentParser(prog="python -m reliability.run")
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--only", help=f"comma-separated names of: {', '.join(registry)}")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--no-doc", action="store_true", help="leave the doc alone")
    parser.add_argument("--json-dir", type=Path, default=ROOT / "build" / "reliability")
    parser.add_argument("--strict", action="store_true", help="a missing harness fails too")
    args = parser.parse_args(argv)
    level = cast("Level", args.level)
    names = list(registry)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in registry]
        if unknown:
            parser.error(f"unknown harness {', '.join(unknown)} (known: {', '.join(registry)})")
    if not args.no_doc and BEGIN not in (args.out.read_text() if args.out.exists() else ""):
        parser.error(f"{args.out} has no {BEGIN} marker")

    console = Console(stderr=True)
    outcomes: list[Outcome] = []
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description:<10}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
    with Progress(*columns, console=console) as progress:
        for name in names:
            task = progress.add_task(name, total=1, status=f"running ({level})")
            outcome = run_harness(name, registry[name], level)
            outcomes.append(outcome)
            progress.update(task, completed=1, status=_status(outcome))

    args.json_dir.mkdir(parents=True, exist_ok=True)
    for outcome in outcomes:
        if outcome.result is not None:
            outcome.result.write(args.json_dir / f"{outcome.name}.json")
    if not args.no_doc:
        rows = {o.name: render_row(o, level) for o in outcomes}
        text = args.out.read_text()
        args.out.write_text(rewrite_section(text, rows, list(registry)))

    summary = Table(title=f"reliability harnesses ({level})")
    for column in ("harness", "cases", "survived", "corrupt", "lost", "outside", "s", "status"):
        summary.add_column(column)
    for o in outcomes:
        r = o.result
        if r is None or not r.ran:
            summary.add_row(o.name, *["-"] * 6, _status(o))
        else:
            numbers = (r.cases, r.survived, r.accepted_corrupt, r.lost_acknowledged)
            summary.add_row(
                o.name, *map(str, numbers), str(r.writes_outside), f"{r.seconds:.1f}", _status(o)
            )
    console.print(summary)
    console.print(f"results: {args.json_dir}" + ("" if args.no_doc else f"; table: {args.out}"))
    skipped = [o.name for o in outcomes if o.status == "not run"]
    if skipped:
        console.print(f"[yellow]not run (neither passed nor failed):[/] {', '.join(skipped)}")
    return exit_status([o.status for o in outcomes], strict=args.strict)


def exit_status(statuses: Sequence[Status], *, strict: bool = False) -> int:
    """0: all passed; 1: one failed (or, ``strict``, did not run); 3: one did not run."""
    if "failed" in statuses:
        return EXIT_FAILED
    if "not run" in statuses:
        return EXIT_FAILED if strict else EXIT_NOT_RUN
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
