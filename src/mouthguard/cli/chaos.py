"""``mouthguard chaos``: inject storage faults into a scratch run of a store and judge the result.

Runs :func:`mouthguard.chaos.run_chaos` against the store's own tiers, each
wrapped in a fault-injecting tier confined to a scratch run
(``chaos-<timestamp>-<random>``): nothing outside that run can be written. The
scratch run is removed afterwards (``--keep`` leaves it for inspection).

Exit codes: 0 every invariant held (no corrupt checkpoint accepted, no
acknowledged save lost, no write outside the run, no crash); 1 otherwise;
2 usage errors (a bad ``--faults`` spec).
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from mouthguard.chaos import (
    DEFAULT_FAULTS,
    ChaosReport,
    remove_run,
    run_chaos,
    scratch_run_name,
)
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import COUNT, EXIT_FAILED, EXIT_OK, checked, integer
from mouthguard.tiers.faults import KINDS, FaultPlan


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``chaos``."""
    chaos = sub.add_parser(
        "chaos", help="inject storage faults into a scratch run; exit 1 if an invariant broke"
    )
    chaos.add_argument("--rounds", type=COUNT, default=50, help="rounds (two saves each)")
    chaos.add_argument(
        "--faults",
        type=checked(FaultPlan.parse),
        default=FaultPlan.parse(DEFAULT_FAULTS),
        help=f"fault rates per tier operation, e.g. {DEFAULT_FAULTS!r} "
        f"(kinds: {', '.join(KINDS)}; delay=RATE:SECONDS)",
    )
    chaos.add_argument("--seed", type=integer(), default=0, help="seed of the faults and choices")
    chaos.add_argument("--keep", action="store_true", help="keep the scratch run afterwards")
    chaos.add_argument("--json", action="store_true", help="print one JSON object")


def run(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Run the chaos rounds on a scratch run of ``store``; exit 0 iff every invariant held."""
    name = scratch_run_name()
    quiet = args.json or not console.is_terminal
    try:
        with Progress(console=console, transient=True, disable=quiet) as progress:
            task = progress.add_task(f"chaos on {name}", total=args.rounds)

            def advance(report: ChaosReport) -> None:
                progress.update(
                    task,
                    advance=1,
                    description=f"round {report.rounds}: {report.cases} faults injected",
                )

            report = run_chaos(
                store,
                rounds=args.rounds,
                plan=args.faults,
                seed=args.seed,
                run=name,
                on_round=advance,
            )
    finally:
        if not args.keep:
            remove_run(store, name)
    if args.json:
        print(json.dumps({**report.to_json(), "kept": args.keep}))
    else:
        _print(report, console, kept=args.keep)
    return EXIT_OK if report.ok else EXIT_FAILED


def _print(report: ChaosReport, console: Console, *, kept: bool) -> None:
    faults = Table(title="injected faults", title_justify="left")
    faults.add_column("kind")
    faults.add_column("count", justify="right")
    for kind in KINDS:
        faults.add_row(kind, str(report.injected.get(kind, 0)))
    faults.add_row("[bold]total[/bold]", f"[bold]{report.cases}[/bold]")
    console.print(faults)

    table = Table(title="invariants", title_justify="left")
    table.add_column("invariant")
    table.add_column("violations", justify="right")
    rows = [
        ("corrupt checkpoints accepted", report.accepted_corrupt),
        ("acknowledged saves lost", report.lost_acknowledged),
        ("writes outside the run", report.writes_outside),
        ("crashes (not a MouthguardError)", report.crashes),
    ]
    for label, count in rows:
        table.add_row(label, "[green]0[/green]" if not count else f"[red]{count}[/red]")
    console.print(table)

    lines = [
        f"{report.rounds} rounds in {report.seconds:.1f} s (seed {report.seed}, "
        f"faults {report.plan or 'none'})",
        f"saves: {report.saves}, acknowledged {report.acknowledged}; "
        f"loads: {report.loads}, {report.load_fallbacks} fell back past a rejected copy",
        f"acknowledged then deleted by retention: {report.deleted_by_policy}; "
        f"lost to torn/short writes the storage acknowledged: {report.lost_to_storage}",
    ]
    for line in lines:
        console.print(line, highlight=False, markup=False)
    for failure in report.failures[:10]:
        console.print(f"[red]violation:[/red] {escape(failure)}", highlight=False, soft_wrap=True)
    where = f"kept as run {report.run}" if kept else f"scratch run {report.run} removed"
    summary = f"{report.survived} of {report.cases} injected faults survived; {where}"
    console.print(f"[green]{summary}[/green]" if report.ok else f"[red]{summary}[/red]")
