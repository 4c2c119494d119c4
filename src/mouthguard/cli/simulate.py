"""``mouthguard simulate``: failures, recoveries and corruption, per storage strategy.

Builds one :class:`~mouthguard.plan.simulate.Scenario` from the model preset
and the options (the same defaults and formulas as ``mouthguard plan``, so the
two agree), simulates it under each storage strategy of
:mod:`mouthguard.plan.strategies`, and prints a table, or one JSON object (its
``policies`` key and the table's ``policy`` column predate the word strategy)::

    {"policies": {"importance": {"cost_usd": ..., "lost_gpu_hours": ...,
                                 "goodput": ..., ...}, "temperature": {...},
                  "flat": {...}},
     "scenario": {...}, "analytic": {...}, "plot": {...}}

``--plot FILE`` also sweeps the checkpoint interval and draws expected cost
against it, in the format the file's suffix names (``.png``, ``.svg``, ``.pdf``;
any other suffix is refused before the sweep). matplotlib is imported only then,
so ``simulate`` without ``--plot`` starts fast.

Exit codes: 0 success; 2 bad input (on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    failure_hours,
    integer,
    print_error,
)
from mouthguard.cli.plan import (
    DEFAULT_GPU_MTBF_HOURS,
    DEFAULT_INTERVAL_S,
    DEFAULT_RUN_DAYS,
    DEFAULT_WINDOW_S,
)
from mouthguard.plan import intervals as iv
from mouthguard.plan import sizing as sz
from mouthguard.plan.presets import resolve_model
from mouthguard.plan.simulate import Scenario, StrategyResult, simulate, sweep_intervals
from mouthguard.plan.strategies import DEFAULT_STRATEGIES, FLAT, StorageStrategy

DEFAULT_PRESET = "llama3-70b"
DEFAULT_RUNS = 200
#: A commonly quoted rate, "$30/GPU-hour" for a 1,000-GPU job; it is also what makes
#: the often-cited $300K per failure of a 16,384-GPU job on a 30-minute schedule add up.
DEFAULT_GPU_HOUR_USD = 30.0
#: Silent corruption per checkpoint (an assumption: no published rate is used).
DEFAULT_CORRUPTION = 0.01
SWEEP_POINTS = 25
SWEEP_SPAN = 8.0  # the sweep covers centre / SPAN .. centre * SPAN
#: Plot formats, chosen by the file's suffix (all three are built into matplotlib).
PLOT_FORMATS = ("png", "svg", "pdf")


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
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    """The scenario and a description of it (JSON-ready). Raises ValueError on bad input."""
    label, params, preset = resolve_model(args.preset)
    gpus = args.gpus if args.gpus is not None else (preset.gpus if preset else None)
    if gpus is None:
        raise ValueError(f"give --gpus: {label} names no GPU count")
    interval: float = args.interval_seconds or (
        (preset.interval_seconds if preset else None) or DEFAULT_INTERVAL_S
    )
    total = sz.checkpoint_bytes(params)
    if args.checkpoint_seconds is not None:
        write = args.checkpoint_seconds
    elif args.write_bandwidth is not None:
        write = sz.write_seconds(total, args.write_bandwidth)
    else:  # as `plan`: storage sized to land the save exactly within the window
        write = (preset.window_seconds if preset else None) or DEFAULT_WINDOW_S
    stall = args.stall_seconds
    if stall is None:
        stall = sz.snapshot_stall_seconds(sz.per_gpu_shard_bytes(total, gpus))
    mtbf: float | None = None
    if args.failure_times_hours is None:
        mtbf = iv.job_mtbf_seconds(
            job_mtbf_hours=args.mtbf_hours,
            gpu_mtbf_hours=None
            if args.mtbf_hours
            else args.gpu_mtbf_hours or DEFAULT_GPU_MTBF_HOURS,
            gpus=gpus,
        )
    sc = Scenario(
        work_seconds=args.run_days * sz.SECONDS_PER_DAY,
        interval_seconds=interval,
        write_seconds=write,
        checkpoint_bytes=total,
        gpus=gpus,
        gpu_hour_usd=args.gpu_hour_usd,
        mtbf_seconds=mtbf,
        failure_times=args.failure_times_hours,
        mode=args.mode,
        snapshot_seconds=stall,
        restart_seconds=args.restart_seconds,
        corruption_probability=args.corruption_probability,
    )
    about = {"model": label, **dataclasses.asdict(sc), "stall_seconds": sc.stall_seconds}
    return sc, about


def _strategies(args: argparse.Namespace) -> list[StorageStrategy]:
    changes = {
        key: value
        for key, value in (
            ("rebuild_probability", args.rebuild_probability),
            ("rebuild_mean_seconds", args.rebuild_mean_seconds),
        )
        if value is not None
    }
    # Only a strategy that demotes ever reads from the erasure-coded slow tier.
    return [
        dataclasses.replace(p, **changes) if p.demote_after_seconds is not None else p
        for p in DEFAULT_STRATEGIES
    ]


def analytic_lost_seconds(sc: Scenario) -> float:
    """Expected wall seconds lost per failure, closed form, for ``flat`` without corruption.

    :mod:`mouthguard.plan.intervals`' model with the restart extended by the
    read of one checkpoint from the flat tier: what the simulator's ``flat``
    converges to when corruption is zero.
    """
    restart = sc.restart_seconds + FLAT.read_seconds(sc.checkpoint_bytes, demoted=False)
    if sc.mode == "sync":
        return iv.expected_lost_seconds_per_failure(sc.interval_seconds, sc.write_seconds, restart)
    return iv.expected_lost_seconds_per_failure_async(
        sc.interval_seconds, sc.snapshot_seconds, sc.write_seconds, restart
    )


def analytic(sc: Scenario) -> dict[str, float | None]:
    """The closed-form figures printed next to the simulation (JSON ``analytic``)."""
    m = sc.mtbf_seconds
    return {
        "expected_lost_seconds_per_failure": analytic_lost_seconds(sc),
        "young_interval_seconds": iv.young_interval(sc.stall_seconds, m) if m else None,
        "daly_interval_seconds": iv.daly_interval(sc.stall_seconds, m) if m else None,
    }


def sweep_grid(sc: Scenario) -> list[float]:
    """Log-spaced intervals, seconds, around the analytic optimum (or the given interval)."""
    centre = sc.interval_seconds
    if sc.mtbf_seconds is not None:
        centre = iv.daly_interval(sc.stall_seconds, sc.mtbf_seconds)
        if sc.mode == "async":  # below W the next snapshot waits for the last write anyway
            centre = max(centre, sc.write_seconds)
    centre = max(centre, 60.0)
    lo, ratio = centre / SWEEP_SPAN, SWEEP_SPAN ** (2 / (SWEEP_POINTS - 1))
    return [lo * ratio**i for i in range(SWEEP_POINTS)]


def run(args: argparse.Namespace, console: Console) -> int:
    """Simulate, print (table or ``--json``), optionally plot; 2 on bad input."""
    try:
        _check_plot_path(args.plot)
        sc, about = build(args)
        strategies = _strategies(args)
        results = simulate(sc, strategies, seed=args.seed, runs=args.runs)
        plot = _plot(args, sc, about, strategies, console) if args.plot else None
    except (ValueError, OSError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    expected = analytic(sc)
    if args.json:
        out = {
            "policies": {name: r.as_dict() for name, r in results.items()},
            "scenario": about,
            "analytic": expected,
            "plot": plot,
        }
        console.file.write(json.dumps(out) + "\n")
        return EXIT_OK
    console.print(_table(about, results, sc))
    lost = analytic_lost_seconds(sc) / 60
    console.print(f"analytic (flat, uncorrupted): {lost:.1f} min lost per failure", highlight=False)
    if plot is not None:
        console.print(f"plot written to {plot['path']}", highlight=False)
    return EXIT_OK


def _check_plot_path(plot: str | None) -> None:
    """Refuse a plot path in a missing directory or of an unknown format before the sweep."""
    if plot is None:
        return
    if not Path(plot).parent.is_dir():
        raise ValueError(f"cannot write {plot}: no such directory")
    if _plot_format(plot) not in PLOT_FORMATS:
        *others, last = (f".{f}" for f in PLOT_FORMATS)
        raise ValueError(
            f"cannot write a plot to {plot}: name a {', '.join(others)} or {last} file"
        )


def _plot_format(plot: str) -> str:
    return Path(plot).suffix.lower().removeprefix(".")


def _plot(
    args: argparse.Namespace,
    sc: Scenario,
    about: dict[str, Any],
    strategies: list[StorageStrategy],
    console: Console,
) -> dict[str, Any]:
    # matplotlib takes a second to import: only a plot pays for it.
    from mouthguard.plan.plot import Curve, cost_vs_interval_figure, optimum, render  # noqa: PLC0415

    grid = sweep_grid(sc)
    show = not args.json and console.is_terminal
    with Progress(console=console, transient=True, disable=not show) as bar:
        task = bar.add_task("sweeping intervals", total=len(grid))
        curves = sweep_intervals(
            sc, strategies, grid, seed=args.seed, runs=args.runs, on_point=lambda: bar.advance(task)
        )
    lines = [Curve(name, grid, [r.cost_usd for r in rs]) for name, rs in curves.items()]
    daly = analytic(sc)["daly_interval_seconds"]
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
        per_failure = r.lost_gpu_hours * sc.gpu_hour_usd / r.failures if r.failures else 0.0
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
