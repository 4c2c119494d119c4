"""``mouthguard simulate``: failures, recoveries and corruption, per storage strategy.

Parses the options into one :class:`~mouthguard.plan.simulate.Scenario`
(:func:`~mouthguard.plan.comparison.scenario_for`: the same defaults and
formulas as ``mouthguard plan``, so the two agree), simulates it under each
storage strategy of :mod:`mouthguard.plan.strategies`, and prints a table, or
one JSON object (its ``policies`` key and the table's ``policy`` column predate
the word strategy)::

    {"policies": {"importance": {"cost_usd": ..., "lost_gpu_hours": ...,
                                 "goodput": ..., ...}, "temperature": {...},
                  "flat": {...}, "peers": {...}},
     "scenario": {..., "from_store": {...} or null}, "analytic": {...},
     "peers": {...}, "plot": {...}}

``peers`` says what the peer-memory strategy assumed (copies, domains, the
chance a failure takes every copy of a rank, save and recovery times, its
closed form); ``{"skipped": why}`` when the job has fewer failure domains than
copies, and the strategy is then left out. ``--from-store STORE --run RUN``
takes the save time and stall from the run's recorded saves
(:mod:`~mouthguard.cli.from_store`).

``--plot FILE`` also sweeps the checkpoint interval and draws expected cost
against it, in the format the file's suffix names (``.png``, ``.svg``, ``.pdf``;
any other suffix is refused before the sweep). matplotlib is imported only then,
so ``simulate`` without ``--plot`` starts fast; it is an optional extra, and
``--plot`` without it is refused before the simulation, naming what to install.

Exit codes: 0 success; 2 bad input, or ``--plot`` without matplotlib (on stderr,
no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from mouthguard.cli.common import (
    BYTES,
    COUNT,
    EXIT_OK,
    EXIT_USAGE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    UsageError,
    failure_hours,
    integer,
    print_error,
)
from mouthguard.cli.from_store import add_options, measured_run
from mouthguard.cli.peer_options import add_peer_options, peer_changes
from mouthguard.cli.plan import deployment
from mouthguard.plan.comparison import (
    analytic_figures,
    analytic_lost_seconds,
    lost_usd_per_failure,
    peer_figures,
    scenario_for,
)
from mouthguard.plan.deployment import DEFAULT_CORRUPTION, DEFAULT_GPU_HOUR_USD, DEFAULT_RUN_DAYS
from mouthguard.plan.simulate import Scenario, StrategyResult, simulate
from mouthguard.plan.strategies import (
    DEFAULT_STRATEGIES,
    StorageStrategy,
    with_peers,
    with_rebuild,
)
from mouthguard.plan.sweep import cost_curves, optimum, sweep_grid

DEFAULT_PRESET = "llama3-70b"
DEFAULT_RUNS = 200
#: Plot formats, chosen by the file's suffix (all three are built into matplotlib).
PLOT_FORMATS = ("png", "svg", "pdf")
#: How to get matplotlib, which only --plot needs.
PLOT_EXTRA = "pip install 'mouthguard[plot]'"


#: (flag, argparse type, default, help) of every option but the MTBF group.
_OPTIONS: list[tuple[str, Any, Any, str]] = [
    ("--preset", str, DEFAULT_PRESET, "model preset or parameter count (default llama3-70b)"),
    ("--gpus", COUNT, None, "GPUs in the job (default: the preset's)"),
    ("--seed", integer(), 0, "random seed (default 0)"),
    ("--runs", COUNT, DEFAULT_RUNS, f"runs averaged (default {DEFAULT_RUNS})"),
    ("--interval-seconds", POSITIVE, None, "compute seconds between saves (default: preset)"),
    ("--checkpoint-seconds", NON_NEGATIVE, None, "seconds to land a save (default: window)"),
    ("--write-bandwidth", BYTES, None, "aggregate write bytes/s, e.g. 600G (not the window)"),
    ("--stall-seconds", NON_NEGATIVE, None, "async snapshot stall (default: shard / 25 GB/s)"),
    ("--restart-seconds", NON_NEGATIVE, 0.0, "restart before the read (default 0)"),
    ("--gpu-hour-usd", NON_NEGATIVE, DEFAULT_GPU_HOUR_USD, "USD per GPU-hour (default 30)"),
    ("--corruption-probability", PROBABILITY, DEFAULT_CORRUPTION, "per save (default 0.01)"),
    ("--rebuild-probability", PROBABILITY, None, "temperature: chance a recovery waits on EC"),
    ("--rebuild-mean-seconds", NON_NEGATIVE, None, "temperature: mean EC rebuild wait"),
    ("--run-days", POSITIVE, DEFAULT_RUN_DAYS, "days of useful compute (default 14)"),
]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``simulate`` and its options on the ``mouthguard`` subparsers."""
    p = sub.add_parser(
        "simulate",
        help="simulate failures and recoveries under each storage policy",
        description="Discrete-event simulation of a training run with failures, comparing "
        "importance-aware, temperature-tiered and flat storage (sizes decimal: 1 GB = 1e9 B).",
    )
    # The model as `plan` takes it (positional) or as --preset: either form works in both.
    p.add_argument(
        "preset",
        nargs="?",
        default=argparse.SUPPRESS,
        metavar="MODEL",
        help="the same as --preset",
    )
    for flag, kind, default, text in _OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--mode", choices=("sync", "async"), default="sync", help="default sync")
    mtbf = p.add_mutually_exclusive_group()
    mtbf.add_argument("--mtbf-hours", type=POSITIVE, help="job MTBF, hours")
    mtbf.add_argument("--gpu-mtbf-hours", type=POSITIVE, help="per-GPU MTBF, hours")
    mtbf.add_argument("--failure-times-hours", type=failure_hours, help="e.g. 3,17.5 (wall hours)")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="also sweep the interval; draw cost vs it (FILE.png, .svg or .pdf)",
    )
    add_peer_options(p)
    add_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    """The scenario and a description of it (JSON-ready). Raises ValueError on bad input."""
    measured = measured_run(args)
    d = deployment(args.preset, args.gpus, args.interval_seconds)
    sc = scenario_for(
        d,
        mode=args.mode,
        checkpoint_seconds=measured.write_seconds if measured else args.checkpoint_seconds,
        write_bandwidth=args.write_bandwidth,
        stall_seconds=measured.stall_seconds if measured else args.stall_seconds,
        restart_seconds=args.restart_seconds,
        gpu_hour_usd=args.gpu_hour_usd,
        corruption_probability=args.corruption_probability,
        run_days=args.run_days,
        mtbf_hours=args.mtbf_hours,
        gpu_mtbf_hours=args.gpu_mtbf_hours,
        failure_times=args.failure_times_hours,
    )
    about = {"model": d.label, **dataclasses.asdict(sc), "stall_seconds": sc.stall_seconds}
    about["from_store"] = measured.as_json() if measured else None
    return sc, about


def run(args: argparse.Namespace, console: Console) -> int:
    """Simulate, print (table or ``--json``), optionally plot; 2 on bad input."""
    try:
        _check_plot(args.plot)
        sc, about = build(args)
        strategies = with_rebuild(
            DEFAULT_STRATEGIES,
            probability=args.rebuild_probability,
            mean_seconds=args.rebuild_mean_seconds,
        )
        changes = peer_changes(args)
        strategies, peers = _peer_strategy(sc, with_peers(strategies, **changes), changes)
        results = simulate(sc, strategies, seed=args.seed, runs=args.runs)
        plot = _plot(args, sc, about, strategies, console, peers) if args.plot else None
    except (ValueError, OSError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    if args.json:
        out = {
            "policies": {name: r.as_dict() for name, r in results.items()},
            "scenario": about,
            "analytic": analytic_figures(sc),
            "peers": peers,
            "plot": plot,
        }
        console.file.write(json.dumps(out) + "\n")
        return EXIT_OK
    console.print(_table(about, results, sc))
    if about["from_store"] is not None:
        console.print(about["from_store"]["summary"], highlight=False, soft_wrap=True)
    lost = analytic_lost_seconds(sc) / 60
    console.print(f"analytic (flat, uncorrupted): {lost:.1f} min lost per failure", highlight=False)
    console.print(_peer_line(peers), highlight=False, soft_wrap=True)
    if plot is not None:
        console.print(f"plot written to {plot['path']}", highlight=False)
    return EXIT_OK


def _peer_strategy(
    sc: Scenario, strategies: list[StorageStrategy], changes: dict[str, Any]
) -> tuple[list[StorageStrategy], dict[str, Any]]:
    """The strategies to simulate and the peer figures (``{"skipped": why}`` without peers).

    A job with fewer failure domains than copies cannot place them: by default
    the peers strategy is then left out, saying why; asked for with a --peer-*
    option, it is an error.
    """
    (strategy,) = (s for s in strategies if s.peers is not None)
    try:
        return strategies, peer_figures(sc, strategy)
    except ValueError as exc:
        if changes:
            raise
        kept = [s for s in strategies if s.peers is None]
        return kept, {"skipped": f"{exc} ({sc.gpus:,} GPUs)"}


def _check_plot(plot: str | None) -> None:
    """Refuse, before the simulation, a plot that cannot be written.

    That is a path in a missing directory, a suffix that names no image format,
    or no matplotlib to draw with (a :class:`UsageError` naming the extra).
    """
    if plot is None:
        return
    if not Path(plot).parent.is_dir():
        raise ValueError(f"cannot write {plot}: no such directory")
    if _plot_format(plot) not in PLOT_FORMATS:
        *others, last = (f".{f}" for f in PLOT_FORMATS)
        raise ValueError(
            f"cannot write a plot to {plot}: name a {', '.join(others)} or {last} file"
        )
    try:
        importlib.import_module("mouthguard.plan.plot")  # matplotlib's only importer
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise  # a broken mouthguard, not a missing extra: let it show
        raise UsageError(f"--plot needs matplotlib, an optional extra: {PLOT_EXTRA}") from None


def _plot_format(plot: str) -> str:
    return Path(plot).suffix.lower().removeprefix(".")


def _plot(  # noqa: PLR0917 - the run's parts, each used
    args: argparse.Namespace,
    sc: Scenario,
    about: dict[str, Any],
    strategies: list[StorageStrategy],
    console: Console,
    peers: dict[str, Any],
) -> dict[str, Any]:
    # matplotlib takes a second to import: only a plot pays for it.
    from mouthguard.plan.plot import cost_vs_interval_figure, render  # noqa: PLC0415

    grid = sweep_grid(sc, peers.get("optimal_interval_seconds"))
    show = not args.json and console.is_terminal
    with Progress(console=console, transient=True, disable=not show) as bar:
        task = bar.add_task("sweeping intervals", total=len(grid))
        lines = cost_curves(
            sc, strategies, grid, seed=args.seed, runs=args.runs, on_point=lambda: bar.advance(task)
        )
    daly = analytic_figures(sc)["daly_interval_seconds"]
    failures = (
        f"job MTBF {sc.mtbf_seconds / 3600:.1f} h"
        if sc.mtbf_seconds
        else f"{len(sc.failure_times or ())} failures"
    )
    subtitle = (
        f"{about['model']}, {sc.gpus:,} GPUs, {sc.checkpoint_bytes / 1e9:,.0f} GB checkpoint, "
        f"{sc.mode} save {sc.write_seconds / 60:.1f} min, {failures}, "
        f"corruption {sc.corruption_probability:.0%}, ${sc.gpu_hour_usd:g}/GPU-h, "
        f"{sc.work_seconds / 86400:g} days, {args.runs} runs per point"
    )
    if "skipped" not in peers:
        subtitle += (
            f"; peers: {peers['replication']} copies, {peers['domains']:,} domains, a failure "
            f"takes {peers['failed_domains']:,}, every {peers['durable_every']} saves durable, "
            f"{peers['link_bytes_per_s'] / 1e9:g} GB/s links"
        )
    fig = cost_vs_interval_figure(
        lines,
        title="Expected cost of failures and checkpoint stalls vs checkpoint interval",
        subtitle=subtitle,
        references=[
            *([(daly, "Daly's optimum (analytic)")] if daly else []),
            (sc.interval_seconds, "interval simulated in the table"),
        ],
    )
    path = Path(args.plot)
    path.write_bytes(render(fig, _plot_format(args.plot)))
    best = {c.label: optimum(c) for c in lines}
    return {
        "path": str(path),
        "intervals_seconds": grid,
        "cost_usd": {c.label: list(c.cost_usd) for c in lines},
        "optimal_interval_seconds": {k: v[0] for k, v in best.items()},
        "optimal_cost_usd": {k: v[1] for k, v in best.items()},
    }


def _peer_line(p: dict[str, Any]) -> str:
    """What the peers row assumes: copies, domains, loss, save and recovery times."""
    if "skipped" in p:
        return f"peers: not simulated: {p['skipped']}"
    lost = p["expected_lost_seconds_per_failure"]
    optimal = p["optimal_interval_seconds"]
    return (
        f"peers: {p['replication']} copies over {p['domains']:,} domains, a failure takes "
        f"{p['failed_domains']:,}: every copy of some rank lost with probability "
        f"{p['loss_probability']:.3g}, then back to a durable copy (every "
        f"{p['durable_every']} saves); lands in peer memory in {p['save_seconds']:.3g} s; "
        f"recovery {p['recovery_from_peers_seconds']:.1f} s from peers, "
        f"{p['recovery_from_durable_seconds']:.1f} s from the durable tier (restart included)"
        + (f"; analytic: {lost / 60:.1f} min lost per failure" if lost is not None else "")
        + (f", optimal interval {optimal / 60:.1f} min" if optimal is not None else "")
    )


def _table(about: dict[str, Any], results: dict[str, StrategyResult], sc: Scenario) -> Table:
    first = next(iter(results.values()))
    title = (
        f"{about['model']} on {sc.gpus:,} GPUs, {sc.work_seconds / 86400:g} days of compute, "
        f"a {sc.mode} save every {sc.interval_seconds / 60:.0f} min ({first.runs} runs)"
    )
    table = Table(title=title, title_justify="left")
    for column in (
        "policy",
        "cost",
        "lost GPU-h",
        "per failure",
        "goodput",
        "failures",
        "fallbacks",
        "recovering",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, r in results.items():
        per_failure = lost_usd_per_failure(r, sc.gpu_hour_usd)
        table.add_row(
            name,
            f"${r.cost_usd:,.0f}",
            f"{r.lost_gpu_hours:,.0f}",
            f"${per_failure:,.0f}",
            f"{r.goodput:.2%}",
            f"{r.failures:.1f}",
            f"{r.fallbacks:.2f}",
            f"{r.recovery_hours:.1f} h",
        )
    return table
