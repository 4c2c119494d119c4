"""What a run's checkpoints cost: bytes, bandwidth, wear, lost work and the optimal interval.

:func:`checkpoint_economics` answers one :class:`PlanQuestion` with every figure
``mouthguard plan`` prints, as one JSON-ready dict. Keys carry their unit as a
suffix (``_bytes``, ``_s`` or ``_seconds``, ``_bytes_per_s``, ``_usd``,
``_fraction``); a figure that needs an input not given (a price, a drive size) is
``None``. The key order is the output's order: scripts read these keys.

Every formula is in :mod:`~mouthguard.plan.sizing` and
:mod:`~mouthguard.plan.intervals`; the run is resolved by
:mod:`~mouthguard.plan.deployment`, as ``simulate`` resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mouthguard.plan import intervals as iv
from mouthguard.plan import peers as pm
from mouthguard.plan import sizing as sz
from mouthguard.plan.deployment import (
    DEFAULT_DWPD,
    DEFAULT_RUN_DAYS,
    DEFAULT_WARRANTY_YEARS,
    Deployment,
    job_mtbf,
    stall_seconds,
    sync_save_seconds,
)

__all__ = ["PlanQuestion", "checkpoint_economics"]

_HOUR = 3600.0


@dataclass(frozen=True)
class PlanQuestion:
    """The inputs of one plan. Seconds, bytes, bytes per second, USD.

    Attributes:
        deployment: the model on its cluster.
        layout: which tensors a checkpoint holds, in which dtypes.
        copies: copies written inline per save (the burst is this many checkpoints).
        write_bandwidth: aggregate write bandwidth, or None (see
            :func:`~mouthguard.plan.deployment.sync_save_seconds`).
        checkpoint_seconds: the sync save's blocking seconds, overriding the rest.
        stall_seconds: the async snapshot stall, overriding the shard's copy time.
        snapshot_bandwidth: per-GPU device-to-host bytes/s of an async snapshot.
        restart_seconds: restart after a failure, before work resumes.
        gpu_hour_usd: price of a GPU-hour, or None (no costs then).
        run_days: length of the run, days of wall time.
        mtbf_hours: the job's MTBF; else ``gpu_mtbf_hours`` per GPU (or its default).
        drive_capacity: bytes per drive of the checkpoint tier, or None (no wear).
        drives: drives the writes spread over.
        dwpd: rated drive writes per day.
        warranty_years: rated drive life.
        peers: the peer-memory column's model (:mod:`~mouthguard.plan.peers`).
    """

    deployment: Deployment
    layout: sz.StateLayout = sz.DEFAULT_LAYOUT
    copies: int = 1
    write_bandwidth: float | None = None
    checkpoint_seconds: float | None = None
    stall_seconds: float | None = None
    snapshot_bandwidth: float = sz.DEFAULT_SNAPSHOT_BYTES_PER_S
    restart_seconds: float = 0.0
    gpu_hour_usd: float | None = None
    run_days: float = DEFAULT_RUN_DAYS
    mtbf_hours: float | None = None
    gpu_mtbf_hours: float | None = None
    drive_capacity: float | None = None
    drives: int = 1
    dwpd: float = DEFAULT_DWPD
    warranty_years: float = DEFAULT_WARRANTY_YEARS
    peers: pm.PeerModel = field(default_factory=pm.PeerModel)


def checkpoint_economics(q: PlanQuestion) -> dict[str, Any]:
    """Every figure of the plan, keyed with unit suffixes. Raises ValueError on bad input."""
    d = q.deployment
    interval, window, gpus = d.interval_seconds, d.window_seconds, d.gpus
    total = sz.checkpoint_bytes(d.parameters, q.layout)
    shard = sz.per_gpu_shard_bytes(total, gpus)
    burst = sz.burst_bytes(total, q.copies)
    land = None if q.write_bandwidth is None else sz.write_seconds(burst, q.write_bandwidth)
    cost, source = sync_save_seconds(
        burst, window, override=q.checkpoint_seconds, write_bandwidth=q.write_bandwidth
    )
    stall = stall_seconds(
        shard, override=q.stall_seconds, snapshot_bytes_per_s=q.snapshot_bandwidth
    )
    mtbf = job_mtbf(gpus, mtbf_hours=q.mtbf_hours, gpu_mtbf_hours=q.gpu_mtbf_hours)
    run_s = q.run_days * sz.SECONDS_PER_DAY
    daily = sz.write_bytes_over(burst, interval)
    run_bytes = sz.write_bytes_over(burst, interval, run_s)
    failures = iv.expected_failures(run_s, mtbf)
    saves = sz.checkpoints_in(run_s, interval)
    floor = iv.min_async_interval(stall, cost)
    out: dict[str, Any] = {
        "model": d.label,
        "parameters": d.parameters,
        "gpus": gpus,
        "bytes_per_parameter": q.layout.bytes_per_parameter(),
        "components_bytes": sz.checkpoint_components(d.parameters, q.layout),
        "checkpoint_bytes": total,
        "per_gpu_shard_bytes": shard,
        "copies": q.copies,
        "burst_bytes": burst,
        "write_bandwidth_bytes_per_s": q.write_bandwidth,
        "time_to_land_s": land,
        "window_seconds": window,
        "bandwidth_needed_bytes_per_s": sz.bandwidth_for_window(burst, window),
        "interval_seconds": interval,
        "checkpoints_per_day": sz.checkpoints_in(sz.SECONDS_PER_DAY, interval),
        "daily_write_bytes": daily,
        "run_seconds": run_s,
        "checkpoints_per_run": saves,
        "run_write_bytes": run_bytes,
        "mtbf_seconds": mtbf,
        "expected_failures": failures,
        "restart_seconds": q.restart_seconds,
        "checkpoint_seconds": cost,
        "checkpoint_seconds_source": source,
        "stall_seconds": stall,
        "async_interval_queues": interval < floor,
        "optimal_interval_young_s": iv.young_interval(cost, mtbf),
        "optimal_interval_daly_s": iv.daly_interval(cost, mtbf),
        "optimal_interval_young_async_s": max(iv.young_interval(stall, mtbf), floor),
        "optimal_interval_daly_async_s": max(iv.daly_interval(stall, mtbf), floor),
        "waste_fraction_sync": iv.waste_fraction(interval, cost, mtbf, q.restart_seconds),
        "waste_fraction_at_daly_sync": iv.waste_fraction(
            iv.daly_interval(cost, mtbf), cost, mtbf, q.restart_seconds
        ),
    }
    out |= _failure_costs(q, interval, (cost, stall), failures, saves)
    out |= _peer_costs(q, total, (interval, cost, mtbf), failures, saves)
    out["gpu_hour_usd"] = q.gpu_hour_usd
    out |= _endurance(q, daily, run_bytes)
    return out


def _failure_costs(
    q: PlanQuestion,
    interval: float,
    blocked: tuple[float, float],
    failures: float,
    saves: float,
) -> dict[str, float | None]:
    """Lost seconds, GPU-hours and their price, per failure and per run, sync then async.

    ``blocked`` is ``(C, S)``: what each save blocks training for, synchronously
    and asynchronously (the async save's write, ``C``, still delays protection).
    """
    cost, stall = blocked
    gpus = q.deployment.gpus
    lost = {
        "sync": iv.expected_lost_seconds_per_failure(interval, cost, q.restart_seconds),
        "async": iv.expected_lost_seconds_per_failure_async(
            interval, stall, cost, q.restart_seconds
        ),
    }
    out: dict[str, float | None] = {}
    for mode, seconds in (("sync", cost), ("async", stall)):
        gpu_h = {
            "lost_gpu_hours_per_failure": lost[mode] * gpus / _HOUR,
            "lost_gpu_hours_per_run": lost[mode] * gpus / _HOUR * failures,
            "checkpoint_gpu_hours_per_run": seconds * saves * gpus / _HOUR,
        }
        out[f"expected_lost_seconds_per_failure_{mode}"] = lost[mode]
        for key, hours in gpu_h.items():
            out[f"{key}_{mode}"] = hours
            usd_key = key.replace("gpu_hours", "cost_usd")
            price = q.gpu_hour_usd
            out[f"{usd_key}_{mode}"] = None if price is None else hours * price
    return out


def _peer_costs(
    q: PlanQuestion,
    total: float,
    run: tuple[float, float, float],
    failures: float,
    saves: float,
) -> dict[str, float | int | None]:
    """The peer-memory column: saves into peers' memory, every k-th also durable.

    ``run`` is ``(T, W, M)``: the interval, the durable write (landing in the
    background, ``W`` after its save) and the job MTBF. A save stalls for its
    copies to the peers; a failure loses, on average, what
    :func:`~mouthguard.plan.peers.expected_lost_seconds_per_failure_peers` says
    with both reads folded into the restart (as the sync and async columns fold
    theirs). The figures are ``None`` when the job has fewer failure domains
    than copies, or when a loss could rewind to the start (no durable copies).
    """
    interval, write, mtbf = run
    peers, gpus = q.peers, q.deployment.gpus
    out: dict[str, float | int | None] = {
        "peer_replication": peers.replication,
        "peer_domains": peers.domains(gpus),
        "peer_failed_domains": min(peers.failed_domains, peers.domains(gpus)),
        "peer_durable_every": peers.durable_every,
    }
    keys = (
        "peer_loss_probability",
        "stall_seconds_peers",
        "expected_lost_seconds_per_failure_peers",
        "lost_gpu_hours_per_failure_peers",
        "lost_cost_usd_per_failure_peers",
        "lost_gpu_hours_per_run_peers",
        "lost_cost_usd_per_run_peers",
        "checkpoint_gpu_hours_per_run_peers",
        "checkpoint_cost_usd_per_run_peers",
        "optimal_interval_peers_s",
    )
    out |= dict.fromkeys(keys)
    if peers.replication > peers.domains(gpus):
        return out
    loss = peers.loss_probability(gpus)
    stall = peers.write_seconds(total, gpus)
    out["peer_loss_probability"] = loss
    out["stall_seconds_peers"] = stall
    if peers.durable_every == 0 and loss > 0:
        return out
    lost = pm.expected_lost_seconds_per_failure_peers(
        interval + stall, 0.0, 0.0, loss, peers.durable_every, write, 0.0, q.restart_seconds
    )
    price = q.gpu_hour_usd
    hours = {
        "lost_gpu_hours_per_failure": lost * gpus / _HOUR,
        "lost_gpu_hours_per_run": lost * gpus / _HOUR * failures,
        "checkpoint_gpu_hours_per_run": stall * saves * gpus / _HOUR,
    }
    out["expected_lost_seconds_per_failure_peers"] = lost
    for key, value in hours.items():
        out[f"{key}_peers"] = value
        out[f"{key.replace('gpu_hours', 'cost_usd')}_peers"] = (
            None if price is None else value * price
        )
    out["optimal_interval_peers_s"] = pm.optimal_interval_peers(
        stall, mtbf, loss, peers.durable_every
    )
    return out


def _endurance(q: PlanQuestion, daily: float, run_bytes: float) -> dict[str, Any]:
    """The drives' wear, when a drive capacity is given (``None`` figures otherwise)."""
    endurance = None
    if q.drive_capacity is not None:
        endurance = sz.drive_endurance(
            daily_bytes=daily,
            run_bytes=run_bytes,
            drive_capacity_bytes=q.drive_capacity,
            dwpd=q.dwpd,
            drives=q.drives,
            warranty_years=q.warranty_years,
        )
    return {
        "drive_capacity_bytes": q.drive_capacity,
        "drives": q.drives,
        "dwpd": q.dwpd,
        "drive_writes_per_day": endurance.drive_writes_per_day if endurance else None,
        "dwpd_used_fraction": endurance.rated_fraction if endurance else None,
        "endurance_used_fraction_run": endurance.run_fraction_of_life if endurance else None,
    }
