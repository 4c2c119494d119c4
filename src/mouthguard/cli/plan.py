"""``mouthguard plan``: what a model's checkpoints cost in bytes, bandwidth, wear and lost work.

Every figure comes from :func:`mouthguard.plan.economics.checkpoint_economics`;
this module only parses the options into a
:class:`~mouthguard.plan.economics.PlanQuestion` and prints the answer as tables
or one JSON object. JSON keys carry their unit as a suffix (``_bytes``, ``_s`` or
``_seconds``, ``_bytes_per_s``, ``_usd``, ``_fraction``).

Exit codes: 0 success; 2 bad input (argparse rejects malformed numbers itself;
:func:`run` reports the rest — unknown model, missing GPU count — on stderr).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from mouthguard.cli.common import (
    BYTES,
    COUNT,
    EXIT_OK,
    EXIT_USAGE,
    NON_NEGATIVE,
    POSITIVE,
    UsageError,
    print_error,
)
from mouthguard.cli.from_store import add_options, measured_run
from mouthguard.cli.peer_options import add_peer_options, peer_changes
from mouthguard.plan import sizing as sz
from mouthguard.plan.deployment import (
    DEFAULT_DWPD,
    DEFAULT_GPU_MTBF_HOURS,
    DEFAULT_RUN_DAYS,
    DEFAULT_WARRANTY_YEARS,
    Deployment,
    MissingInputError,
    resolve_deployment,
)
from mouthguard.plan.economics import PlanQuestion, checkpoint_economics
from mouthguard.plan.measured import MeasuredRun
from mouthguard.plan.peers import PeerModel
from mouthguard.plan.presets import preset_names

_DTYPES = list(sz.DTYPE_BYTES)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``plan`` and its options on the ``mouthguard`` subparsers."""
    p = sub.add_parser(
        "plan",
        help="checkpoint size, bandwidth, wear, lost work and the optimal interval",
        description="Checkpoint economics of a training run (sizes are decimal: 1 GB = 1e9 B).",
    )
    model = (
        f"a preset ({', '.join(preset_names())}; aliases 70b, 405b, 15t) "
        "or a parameter count (70B, 1.5T, 7e9)"
    )
    # Positional or --preset, as `simulate` takes it: either form works in both.
    p.add_argument("model", nargs="?", default=argparse.SUPPRESS, metavar="MODEL", help=model)
    p.add_argument("--preset", dest="model", metavar="MODEL", help="the same as MODEL")
    for flags, kwargs in _OPTIONS:
        p.add_argument(*flags, **kwargs)
    mtbf = p.add_mutually_exclusive_group()
    mtbf.add_argument("--mtbf-hours", type=POSITIVE, help="mean hours between job failures")
    mtbf.add_argument(
        "--gpu-mtbf-hours",
        type=POSITIVE,
        help=f"mean hours between failures of one GPU (default {DEFAULT_GPU_MTBF_HOURS:,.0f})",
    )
    add_peer_options(p)
    add_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (keys carry units)")


def _opt(flag: str, kind: Any, help_text: str, default: Any = None) -> tuple[tuple[str], Any]:
    key = "choices" if isinstance(kind, list) else "type"
    return (flag,), {key: kind, "default": default, "help": help_text}


_OPTIONAL = [*_DTYPES, "none"]
_OPTIONS = [
    _opt("--weights-dtype", _DTYPES, "default bf16", "bf16"),
    _opt("--optimizer-dtype", _DTYPES, "Adam m and v (default fp32)", "fp32"),
    _opt("--gradients-dtype", _OPTIONAL, "default bf16", "bf16"),
    _opt("--master-weights-dtype", _OPTIONAL, "default none", "none"),
    _opt("--gpus", COUNT, "GPUs in the job (default: the preset's)"),
    _opt("--interval-seconds", POSITIVE, "compute seconds between saves (default: preset, 1800)"),
    _opt("--write-bandwidth", BYTES, "aggregate write bandwidth, bytes/s (e.g. 600G)"),
    _opt("--window-seconds", POSITIVE, "seconds to land a save in (default: preset, 300)"),
    _opt("--copies", COUNT, "copies written inline per save (default 1)", 1),
    _opt("--checkpoint-seconds", NON_NEGATIVE, "override the sync save's blocking seconds"),
    _opt("--stall-seconds", NON_NEGATIVE, "override the async snapshot stall, seconds"),
    _opt(
        "--snapshot-bandwidth",
        BYTES,
        "per-GPU device-to-host bytes/s of an async snapshot (default 25G)",
        sz.DEFAULT_SNAPSHOT_BYTES_PER_S,
    ),
    _opt("--restart-seconds", NON_NEGATIVE, "seconds to restart after a failure (default 0)", 0.0),
    _opt("--gpu-hour-usd", NON_NEGATIVE, "USD per GPU-hour (no costs without it)"),
    _opt("--run-days", POSITIVE, "run length in days (default 14)", DEFAULT_RUN_DAYS),
    _opt("--drive-capacity", BYTES, "bytes per drive of the checkpoint tier (e.g. 30.72T)"),
    _opt("--drives", COUNT, "drives the writes spread over (default 1)", 1),
    _opt("--dwpd", POSITIVE, "rated drive writes per day (default 1)", DEFAULT_DWPD),
    _opt(
        "--warranty-years",
        POSITIVE,
        "rated drive life in years (default 5)",
        DEFAULT_WARRANTY_YEARS,
    ),
]


def question(args: argparse.Namespace, measured: MeasuredRun | None = None) -> PlanQuestion:
    """The plan's inputs from the parsed options. Raises ValueError on bad input.

    ``measured`` (``--from-store``) gives the sync save's seconds and, when the
    run made async saves, their stall.
    """
    if args.model is None:
        raise UsageError("give a model: a preset name or a parameter count (MODEL or --preset)")
    layout = sz.StateLayout(
        weights=args.weights_dtype,
        adam_m=args.optimizer_dtype,
        adam_v=args.optimizer_dtype,
        gradients=args.gradients_dtype,
        master_weights=args.master_weights_dtype,
    )
    return PlanQuestion(
        deployment=deployment(args.model, args.gpus, args.interval_seconds, args.window_seconds),
        layout=layout,
        copies=args.copies,
        write_bandwidth=args.write_bandwidth,
        checkpoint_seconds=measured.write_seconds if measured else args.checkpoint_seconds,
        stall_seconds=measured.stall_seconds if measured else args.stall_seconds,
        snapshot_bandwidth=args.snapshot_bandwidth,
        restart_seconds=args.restart_seconds,
        gpu_hour_usd=args.gpu_hour_usd,
        run_days=args.run_days,
        mtbf_hours=args.mtbf_hours,
        gpu_mtbf_hours=args.gpu_mtbf_hours,
        drive_capacity=args.drive_capacity,
        drives=args.drives,
        dwpd=args.dwpd,
        warranty_years=args.warranty_years,
        peers=PeerModel(**peer_changes(args)),
    )


def deployment(
    model: str, gpus: int | None, interval: float | None = None, window: float | None = None
) -> Deployment:
    """The run of ``model`` (shared with ``simulate``); a missing figure names its option."""
    try:
        return resolve_deployment(
            model, gpus=gpus, interval_seconds=interval, window_seconds=window
        )
    except MissingInputError as exc:
        raise UsageError(f"give --{exc.name}: {exc}") from None


def run(args: argparse.Namespace, console: Console) -> int:
    """Print the plan (table, or one JSON object with ``--json``); 2 on bad input."""
    try:
        measured = measured_run(args)
        figures = checkpoint_economics(question(args, measured))
    except ValueError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    figures["from_store"] = None
    if measured is not None:
        figures["checkpoint_seconds_source"] = "store"
        figures["from_store"] = measured.as_json()
    if args.json:
        console.file.write(json.dumps(figures) + "\n")
        return EXIT_OK
    for table in _tables(figures):
        console.print(table)
    console.print(_peer_note(figures), highlight=False, soft_wrap=True)
    if measured is not None:
        console.print(measured.describe(), highlight=False, soft_wrap=True)
    if figures["async_interval_queues"]:
        console.print("note: async writes take longer than the interval; saves would queue")
    return EXIT_OK


def _size(n: float | None, suffix: str = "") -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}{suffix}" if unit == "B" else f"{n:.1f} {unit}{suffix}"
        n /= 1000
    raise AssertionError("unreachable")


_DURATIONS = ((1, "ms", 1e-3), (120, "s", 1), (7200, "min", 60), (172_800, "h", 3600))


def _time(s: float | None) -> str:
    if s is None:
        return "—"
    for limit, unit, scale in _DURATIONS:
        if s < limit:
            return f"{s / scale:.1f} {unit}"
    return f"{s / 86_400:.1f} days"


def _usd(x: float | None) -> str:
    return "— (no --gpu-hour-usd)" if x is None else f"${x:,.0f}"


def _num(x: float | None, fmt: str = ",.1f") -> str:
    return "—" if x is None else format(x, fmt)


def _table(title: str, rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _tables(f: dict[str, Any]) -> list[Table]:
    per_param = [
        (k, f"{v / f['parameters']:g} B", _size(v)) for k, v in f["components_bytes"].items()
    ]
    per_param.append(("total", f"{f['bytes_per_parameter']} B", _size(f["checkpoint_bytes"])))
    endurance = f"{_num(f['drive_writes_per_day'], '.3f')} ({_num(f['dwpd_used_fraction'], '.1%')})"
    storage = [
        ("per-GPU shard", _size(f["per_gpu_shard_bytes"])),
        (f"burst ({f['copies']}x the checkpoint)", _size(f["burst_bytes"])),
        ("write bandwidth", _size(f["write_bandwidth_bytes_per_s"], "/s")),
        ("time to land the burst", _time(f["time_to_land_s"])),
        (f"bandwidth to land it in {_time(f['window_seconds'])}", _rate(f, "bandwidth_needed")),
        ("written per day", _size(f["daily_write_bytes"])),
        (f"written per run ({f['checkpoints_per_run']:,.0f} saves)", _size(f["run_write_bytes"])),
        ("drive writes per day (of rated DWPD)", endurance),
        ("rated drive life used by the run", _num(f["endurance_used_fraction_run"], ".2%")),
    ]

    def pair(
        label: str, sync: str, async_: str, fmt: Callable[[Any], str], peers: str | None = None
    ) -> tuple[str, ...]:
        return label, fmt(f[sync]), fmt(f[async_]), "—" if peers is None else fmt(f[peers])

    def modes(label: str, key: str, fmt: Callable[[Any], str]) -> tuple[str, ...]:
        return pair(label, f"{key}_sync", f"{key}_async", fmt, f"{key}_peers")

    waste = f"{f['waste_fraction_sync']:.2%} / {f['waste_fraction_at_daly_sync']:.2%}"
    failures = [
        pair(
            "training blocked per save",
            "checkpoint_seconds",
            "stall_seconds",
            _time,
            "stall_seconds_peers",
        ),
        modes("lost per failure", "expected_lost_seconds_per_failure", _time),
        modes("lost GPU-hours per failure", "lost_gpu_hours_per_failure", _num),
        modes("cost per failure", "lost_cost_usd_per_failure", _usd),
        modes("cost of failures per run", "lost_cost_usd_per_run", _usd),
        modes("cost of save stalls per run", "checkpoint_cost_usd_per_run", _usd),
        pair("optimal interval, Young", *_keys("young"), _time, "optimal_interval_peers_s"),
        pair("optimal interval, Daly", *_keys("daly"), _time),
        ("time wasted now / at Daly's interval", waste, "", ""),
    ]
    title = (
        f"failures over {_time(f['run_seconds'])}: job MTBF {_time(f['mtbf_seconds'])}, "
        f"{f['expected_failures']:,.1f} expected"
    )
    return [
        _table(f"checkpoint of {f['model']}", per_param, ("component", "per param", "size")),
        _table(
            f"storage: {f['gpus']:,} GPUs, a save every {_time(f['interval_seconds'])}",
            storage,
            ("", "value"),
        ),
        _table(title, failures, ("", "sync", "async", "peers")),
    ]


def _peer_note(f: dict[str, Any]) -> str:
    """Below the table: what the peers column assumes."""
    head = (
        f"peers: {f['peer_replication']} copies over {f['peer_domains']:,} failure domains, "
        f"a failure takes {f['peer_failed_domains']:,}"
    )
    if f["peer_loss_probability"] is None:
        return f"{head}: not possible, fewer domains than copies"
    tail = (
        f"; every copy of some rank lost with probability {f['peer_loss_probability']:.3g}, "
        f"then back to the newest durable copy (every {f['peer_durable_every']} saves, "
        "written in the background); reads folded into the restart, as in the other columns"
    )
    return head + tail


def _rate(f: dict[str, Any], key: str) -> str:
    return _size(f[f"{key}_bytes_per_s"], "/s")


def _keys(formula: str) -> tuple[str, str]:
    return f"optimal_interval_{formula}_s", f"optimal_interval_{formula}_async_s"
