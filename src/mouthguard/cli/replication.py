"""``mouthguard replicate``: one replication pass now; exit 1 unless every checkpoint is protected.

Each checkpoint visited (of one run, or of every run, newest first per run) gets
the copies its importance asks for, each read back before it counts (see
:class:`~mouthguard.jobs.replicator.Replicator`). The output is the copies made,
the shortfalls, and why each checkpoint still unprotected is not; with
``--json``, one JSON object.

Exit codes (:mod:`mouthguard.cli.common`): 0 every checkpoint visited is
protected; 1 some is not; 2 usage errors (a run with no checkpoints).
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.gathering import gather
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, Handler, UsageError
from mouthguard.cli.render import human_bytes
from mouthguard.jobs.replicator import ReplicationReport, Replicator
from mouthguard.policy.placement import protection_status


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``replicate``."""
    rep = sub.add_parser("replicate", help="one replication pass; exit 1 unless all protected")
    rep.add_argument("run", nargs="?", help="only this run")
    rep.add_argument("--json", action="store_true", help="print one JSON object")


def targets_of(store: Store, run: str | None) -> list[tuple[str, int]]:
    """Checkpoints a pass visits, in :meth:`Replicator.run_once` order (newest first per run)."""
    runs = [catalog.validate_run(run)] if run is not None else None
    return Replicator(store, store.policy).targets(runs)


def _unprotected(replicator: Replicator, targets: list[tuple[str, int]]) -> list[str]:
    """Why each checkpoint that is not protected after the pass is not (one line each)."""
    lines = []
    for run, step in targets:
        view = gather(replicator.store, run, step)
        if view is None:
            continue  # deleted meanwhile: nothing left to protect
        status = protection_status(view.facts, replicator.placement(view))
        if status.state != "protected":
            lines.append(f"{run} step {step}: {status.state}: {'; '.join(status.missing)}")
    return lines


def _replicate(store: Store, args: argparse.Namespace, console: Console) -> int:
    """One pass over ``args.run`` (else every run); exit 0 iff every checkpoint is protected."""
    from rich.progress import Progress  # noqa: PLC0415 - only replicate shows progress

    targets = targets_of(store, args.run)
    if args.run is not None and not targets:
        raise UsageError(f"no checkpoints for run {args.run!r} in {store.source}")
    replicator = Replicator(store, store.policy)
    quiet = args.json or not console.is_terminal
    with Progress(console=console, transient=True, disable=quiet) as progress:
        task = progress.add_task("replicating", total=len(targets))

        def advance(run: str, step: int) -> None:
            progress.update(task, description=f"{run} step {step}", advance=1)

        runs = [args.run] if args.run is not None else None
        report = replicator.run_once(runs, on_checkpoint=advance)
    ok = report.protected == report.checked
    why = [] if ok else _unprotected(replicator, targets)
    if args.json:
        print(json.dumps(_report_json(report, ok, why)))
    else:
        _print_report(report, why, console, store)
    return EXIT_OK if ok else EXIT_FAILED


def _report_json(report: ReplicationReport, ok: bool, why: list[str]) -> dict[str, object]:
    return {
        "ok": ok,
        "checked": report.checked,
        "protected": report.protected,
        "copied_bytes": report.copied_bytes,
        "copies": [
            {
                "run": c.run,
                "step": c.step,
                "source": c.source,
                "destination": c.destination,
                "nbytes": c.nbytes,
                "seconds": round(c.seconds, 6),
            }
            for c in report.copies
        ],
        "shortfalls": [
            {"run": s.run, "step": s.step, "reason": s.reason} for s in report.shortfalls
        ],
        "unprotected": why,
    }


def _print_report(
    report: ReplicationReport, why: list[str], console: Console, store: Store
) -> None:
    if not report.checked:
        console.print(f"nothing to replicate in {store.source}", highlight=False)
        return
    if report.copies:
        table = Table(title="copies", title_justify="left")
        for column in ("run", "step", "copy", "size", "seconds"):
            table.add_column(
                column, justify="right" if column in ("step", "size", "seconds") else "left"
            )
        for c in report.copies:
            table.add_row(
                c.run,
                str(c.step),
                escape(f"{c.source} -> {c.destination}"),
                human_bytes(c.nbytes),
                f"{c.seconds:.2f}",
            )
        console.print(table)
    if report.shortfalls:
        table = Table(title="shortfalls", title_justify="left")
        for column in ("run", "step", "reason"):
            table.add_column(column, justify="right" if column == "step" else "left")
        for s in report.shortfalls:
            table.add_row(s.run, str(s.step), escape(s.reason))
        console.print(table)
    for line in why:
        console.print(f"[red]not protected:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    summary = (
        f"{report.checked} checked, {report.protected} protected, "
        f"{len(report.copies)} copies ({human_bytes(report.copied_bytes)})"
    )
    ok = report.protected == report.checked
    console.print(f"[green]{summary}[/green]" if ok else f"[red]{summary}[/red]", highlight=False)


HANDLERS: dict[str, Handler] = {"replicate": _replicate}

__all__ = ["HANDLERS", "add_parser", "targets_of"]
