"""``mouthguard`` command line: inspect, verify, protect and demo checkpoint stores.

Subcommands beyond listing and verification live in :mod:`mouthguard.cli.ops`
(hold, release, promote alias importance, replicate, agent),
:mod:`mouthguard.cli.lifecycle` (gc, restore) and :mod:`mouthguard.cli.doctor`;
``scrub`` (re-verification now) lives here with ``verify``.

Exit codes: 0 success; 1 a checkpoint copy or one of its sidecars is invalid
(``verify``), a copy is damaged (``scrub``), no intact source exists
(``restore``), not protected (``replicate``), a placement is unsatisfiable
(``doctor``), there is no such hold (``release``), an invariant broke under injected
faults (``chaos``), or the demo did not reproduce
the reference run; 2 usage errors (bad arguments, unknown store, tier, run or
step). Bad data never produces a traceback: every :class:`MouthguardError`
becomes a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import CheckpointInfo
from mouthguard.checkpoint.sidecars import CopyRef, check_sidecars
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.checkpoint.verification import CopyReport, CopyTarget, find_copies, verify_target
from mouthguard.cli import chaos, doctor, lifecycle, ops, plan, simulate
from mouthguard.cli.render import human_bytes, human_time
from mouthguard.errors import CheckpointNotFoundError, ConfigError, MouthguardError
from mouthguard.jobs.burst import MAX_YIELD_SECONDS, BurstGate
from mouthguard.jobs.scrub import ScrubReport, ScrubResult, scrub

DEFAULT_STORE = "./mouthguard-store"
EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def non_negative_int(text: str) -> int:
    """Argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


class UsageError(Exception):
    """A command was given arguments that name nothing (exit code 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="mouthguard", description="Importance-aware, verified checkpoint storage."
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("MOUTHGUARD_STORE", DEFAULT_STORE),
        help="store directory or mouthguard.toml "
        "(default: $MOUTHGUARD_STORE, else ./mouthguard-store)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", help="list committed checkpoints")
    ls.add_argument("run", nargs="?", help="only this run")
    ls.add_argument("--json", action="store_true", help="print JSON lines, one per checkpoint")

    show = sub.add_parser("show", help="show one checkpoint")
    show.add_argument("run")
    show.add_argument("step", type=int)
    show.add_argument("--json", action="store_true", help="print one JSON object")

    verify = sub.add_parser("verify", help="read every byte and check every checksum")
    verify.add_argument("run", nargs="?")
    verify.add_argument("step", nargs="?", type=int)
    verify.add_argument("--json", action="store_true", help="print JSON lines, one per copy")

    lifecycle.add_parsers(sub)
    scrub = sub.add_parser("scrub", help="re-read copies now; exit 1 if any is damaged")
    scrub.add_argument(
        "--max-age-seconds",
        type=lifecycle.non_negative_float,
        default=0.0,
        help="skip copies verified less than this long ago (default 0: re-read all)",
    )
    scrub.add_argument(
        "--budget-bytes", type=non_negative_int, default=None, help="stop after reading this much"
    )
    scrub.add_argument("--json", action="store_true", help="print JSON lines")

    ops.add_parsers(sub)
    doctor.add_parser(sub)
    sub.add_parser("demo", help="train, crash, corrupt, resume: watch a run survive")
    plan.add_parser(sub)
    simulate.add_parser(sub)
    chaos.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mouthguard`` command."""
    args = build_parser().parse_args(argv)
    console = Console()
    err = Console(stderr=True)
    try:
        if args.command == "demo":
            from mouthguard.cli.demo import run_demo  # noqa: PLC0415 - heavy, demo only

            return run_demo(Path(args.store), console)
        if args.command in {"plan", "simulate"}:  # arithmetic: no store needed
            runner = plan.run if args.command == "plan" else simulate.run
            return runner(args, console)
        store = open_store(args.store, create=False)
        handlers: dict[str, ops.Handler] = {"ls": _ls, "show": _show, "verify": _verify}
        handlers["scrub"] = _scrub
        handlers["chaos"] = chaos.run
        handlers.update({**lifecycle.HANDLERS, **ops.HANDLERS, "doctor": doctor.run})
        handler = handlers[args.command]
        return handler(store, args, console)
    # A checkpoint or run that does not exist is a wrong argument, not bad data.
    except (UsageError, ConfigError, ValueError, CheckpointNotFoundError) as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        return EXIT_USAGE
    except MouthguardError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        return EXIT_INVALID
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def _runs(store: Store, run: str | None) -> list[str]:
    if run is not None:
        catalog.validate_run(run)
        return [run]
    return sorted({r for tier in store.tiers for r in catalog.list_runs(tier)})


def _ls(store: Store, args: argparse.Namespace, console: Console) -> int:
    runs = _runs(store, args.run)
    listed = {run: Checkpointer(store, run).list() for run in runs}
    if args.run is not None and not listed[args.run]:
        raise UsageError(f"no checkpoints for run {args.run!r} in {store.source}")
    if args.json:
        for infos in listed.values():
            for info in infos:
                print(json.dumps(info.to_json()))
        return EXIT_OK
    if not any(listed.values()):
        console.print(f"no checkpoints in {store.source}")
        return EXIT_OK
    for run, infos in listed.items():
        if infos:
            console.print(_run_table(run, infos))
    return EXIT_OK


def _run_table(run: str, infos: list[CheckpointInfo]) -> Table:
    # Sized for an 80-column terminal: per-file detail lives in `show`, and the
    # holds column appears only when some checkpoint of the run has a hold.
    with_holds = any(info.holds for info in infos)
    columns = ["step", "importance", "state", "size", "created", "copies"]
    table = Table(title=f"run {run}", title_justify="left")
    for column in [*columns, "holds"] if with_holds else columns:
        wrap = column in ("copies", "holds")
        table.add_column(
            column,
            justify="right" if column in ("step", "size") else "left",
            no_wrap=not wrap,
            min_width=8 if wrap else None,
        )
    for info in infos:
        copies = " ".join(f"{c.tier}{'✓' if c.verified else ''}" for c in info.copies)
        row = [
            str(info.step),
            info.importance.value,
            info.state,
            human_bytes(info.nbytes),
            info.created.astimezone().strftime("%m-%d %H:%M"),
            copies,
        ]
        if with_holds:
            row.append(", ".join(info.holds))
        table.add_row(*row)
    return table


def _show(store: Store, args: argparse.Namespace, console: Console) -> int:
    catalog.validate_run(args.run)
    catalog.step_dir(args.step)
    info = Checkpointer(store, args.run).info(args.step, missing_ok=True)
    if info is None:
        raise UsageError(f"no readable checkpoint {args.run} step {args.step} in {store.source}")
    if args.json:
        print(json.dumps(info.to_json(), indent=2))
        return EXIT_OK
    table = Table(title=f"{info.run} step {info.step}", show_header=False, title_justify="left")
    table.add_column("field")
    table.add_column("value")
    table.add_row("importance", info.importance.value)
    if info.saved_importance is not None and info.saved_importance != info.importance:
        table.add_row("saved importance", info.saved_importance.value)
    table.add_row("state", info.state)
    for missing in info.protection:
        table.add_row("missing for protection", escape(missing))
    table.add_row("holds", ", ".join(info.holds) or "none")
    table.add_row("created", human_time(info.created))
    table.add_row("size", f"{human_bytes(info.nbytes)} ({info.nbytes} bytes)")
    table.add_row("tensor bytes", str(info.tensor_bytes))
    table.add_row("world size", str(info.world_size))
    for f in info.files:
        table.add_row(f.name, f"{human_bytes(f.size)}  {f.checksum}")
    for c in info.copies:
        verified = f"verified {human_time(c.verified_at)}" if c.verified_at else "not verified"
        table.add_row(f"copy on {c.tier}", f"{c.location}  ({verified})")
    console.print(table)
    return EXIT_OK


def _verify(store: Store, args: argparse.Namespace, console: Console) -> int:
    if args.step is not None:
        catalog.step_dir(args.step)
    if args.run is not None:
        catalog.validate_run(args.run)
    targets = find_copies(store, args.run, args.step)
    if not targets:
        if args.run is None:
            console.print(f"nothing to verify in {store.source}")
            return EXIT_OK
        what = args.run if args.step is None else f"{args.run} step {args.step}"
        raise UsageError(f"no committed checkpoint {what} in {store.source}")
    reports = _run_verification(targets, console, quiet=args.json)
    if args.json:
        for r in reports:
            print(
                json.dumps(
                    {
                        "run": r.run,
                        "step": r.step,
                        "tier": r.tier,
                        "location": r.location,
                        "ok": r.ok,
                        "reason": r.reason,
                    }
                )
            )
    else:
        _print_reports(reports, console)
    return EXIT_OK if all(r.ok for r in reports) else EXIT_INVALID


def _run_verification(
    targets: list[CopyTarget], console: Console, *, quiet: bool
) -> list[CopyReport]:
    with Progress(
        console=console, transient=True, disable=quiet or not console.is_terminal
    ) as progress:
        task = progress.add_task("verifying", total=len(targets))
        reports = []
        for target in targets:
            # Sidecars first, as found: the data check below rewrites the receipt.
            damaged = sidecar_problems(target)
            report = verify_target(target)
            if damaged:
                why = "; ".join(damaged) if report.ok else "; ".join([report.reason, *damaged])
                report = dataclasses.replace(report, ok=False, reason=why)
            reports.append(report)
            progress.advance(task)
        return reports


def sidecar_problems(target: CopyTarget) -> list[str]:
    """Every sidecar of one copy that fails its checksum or does not parse, naming tier and file."""
    where = f"sidecar on {target.tier.name}"
    try:
        damaged = check_sidecars(CopyRef(target.tier, target.run, target.step))
    except MouthguardError as exc:
        return [f"{where}: cannot read the sidecars: {exc}"]
    return [f"{where} {name} is damaged: {why}" for name, why in damaged]


def _print_reports(reports: list[CopyReport], console: Console) -> None:
    table = Table(title="verification", title_justify="left")
    for column in ("run", "step", "tier", "size", "result"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for r in reports:
        result = "[green]valid[/green]" if r.ok else f"[red]INVALID[/red]: {escape(r.reason)}"
        table.add_row(r.run, str(r.step), r.tier, human_bytes(r.nbytes), result)
    console.print(table)
    bad = sum(not r.ok for r in reports)
    summary = f"{len(reports) - bad} valid, {bad} invalid"
    console.print(f"[red]{summary}[/red]" if bad else f"[green]{summary}[/green]")


# --- scrub ---------------------------------------------------------------------------


class _CountingGate(BurstGate):
    """A burst gate that also advances a progress bar: the scrubber waits once per copy."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        super().__init__()
        self.progress, self.task, self.started = progress, task, 0

    def wait(self, timeout: float = MAX_YIELD_SECONDS) -> float:
        """Count the copy about to be read, then yield to saves as usual."""
        self.started += 1
        self.progress.update(self.task, description=f"scrubbing copy {self.started}")
        return super().wait(timeout)


def _status_of(r: ScrubResult) -> tuple[str, str]:
    """``(ok|damaged|unreachable, reason without its prefix)``."""
    if r.ok:
        return "ok", ""
    status, _, reason = r.reason.partition(": ")
    return (status, reason) if status in ("damaged", "unreachable") else ("damaged", r.reason)


def _scrub(store: Store, args: argparse.Namespace, console: Console) -> int:
    with lifecycle.progress(console, show=not args.json and console.is_terminal) as bar:
        task = bar.add_task("scrubbing", total=None)
        report = scrub(
            store,
            max_age_seconds=args.max_age_seconds,
            budget_bytes=args.budget_bytes,
            gate=_CountingGate(bar, task),
        )
    if args.json:
        for r in report.results:
            status, reason = _status_of(r)
            line = {
                "kind": "copy",
                "run": r.run,
                "step": r.step,
                "tier": r.tier,
                "ok": r.ok,
                "status": status,
                "reason": reason,
                "nbytes": r.nbytes,
            }
            print(json.dumps(line))
        print(json.dumps({"kind": "summary", **_scrub_counts(report)}))
    else:
        _print_scrub(report, console)
    return EXIT_OK if all(r.ok for r in report.results) else EXIT_INVALID


def _scrub_counts(report: ScrubReport) -> dict[str, int]:
    statuses = [_status_of(r)[0] for r in report.results]
    return {
        "scrubbed": len(statuses),
        "ok": statuses.count("ok"),
        "damaged": statuses.count("damaged"),
        "unreachable": statuses.count("unreachable"),
        "skipped_fresh": report.skipped_fresh,
    }


def _print_scrub(report: ScrubReport, console: Console) -> None:
    if report.results:
        table = Table(title="scrub", title_justify="left")
        for column in ("run", "step", "tier", "size", "result"):
            table.add_column(column, justify="right" if column in ("step", "size") else "left")
        for r in report.results:
            status, reason = _status_of(r)
            result = {
                "ok": "[green]ok[/green]",
                "damaged": f"[red]DAMAGED[/red] (set aside): {escape(reason)}",
                "unreachable": f"[yellow]unreachable[/yellow]: {escape(reason)}",
            }[status]
            table.add_row(escape(r.run), str(r.step), escape(r.tier), human_bytes(r.nbytes), result)
        console.print(table)
    c = _scrub_counts(report)
    summary = (
        f"{c['ok']} ok, {c['damaged']} damaged, {c['unreachable']} unreachable; "
        f"{c['skipped_fresh']} skipped (verified within --max-age-seconds)"
    )
    bad = c["damaged"] + c["unreachable"]
    console.print(f"[red]{summary}[/red]" if bad else f"[green]{summary}[/green]", highlight=False)
    if c["damaged"]:
        console.print(
            "damaged copies were set aside; `mouthguard replicate` makes new ones "
            "from intact copies",
            highlight=False,
        )


if __name__ == "__main__":
    sys.exit(main())
