"""What ``mouthguard simulate`` compares: the scenario of a run, and the closed form beside it.

:func:`scenario_for` turns a :class:`~mouthguard.plan.deployment.Deployment` and
the options into the :class:`~mouthguard.plan.simulate.Scenario` every strategy
is simulated under, with the same defaults and formulas as ``mouthguard plan``
(so the two commands agree on the run). :func:`analytic_figures` gives the
closed-form numbers the simulation is checked against.

Pure arithmetic: seconds, bytes, USD; no I/O.
"""

from __future__ import annotations

from typing import Literal

from mouthguard.plan import deployment as dp
from mouthguard.plan import intervals as iv
from mouthguard.plan import sizing as sz
from mouthguard.plan.peers import expected_lost_seconds_per_failure_peers, optimal_interval_peers
from mouthguard.plan.simulate import Scenario, StrategyResult
from mouthguard.plan.strategies import FLAT, StorageStrategy

__all__ = [
    "analytic_figures",
    "analytic_lost_seconds",
    "lost_usd_per_failure",
    "peer_figures",
    "scenario_for",
]


def scenario_for(
    d: dp.Deployment,
    *,
    mode: Literal["sync", "async"] = "sync",
    checkpoint_seconds: float | None = None,
    write_bandwidth: float | None = None,
    stall_seconds: float | None = None,
    restart_seconds: float = 0.0,
    gpu_hour_usd: float = dp.DEFAULT_GPU_HOUR_USD,
    corruption_probability: float = dp.DEFAULT_CORRUPTION,
    run_days: float = dp.DEFAULT_RUN_DAYS,
    mtbf_hours: float | None = None,
    gpu_mtbf_hours: float | None = None,
    failure_times: tuple[float, ...] | None = None,
) -> Scenario:
    """The scenario of ``d``: a full default-layout checkpoint, one copy per save.

    The write ``W`` is ``checkpoint_seconds``, else the checkpoint at
    ``write_bandwidth``, else the deployment's window (as ``plan`` sizes a sync
    save); the snapshot stall is ``stall_seconds``, else one GPU's shard at the
    default device-to-host rate. Failures are ``failure_times`` (seconds, sorted)
    when given, else exponential with the job MTBF (:func:`~mouthguard.plan.deployment.job_mtbf`).
    Raises :class:`ValueError` for values outside the scenario's domain.
    """
    total = sz.checkpoint_bytes(d.parameters)
    write, _source = dp.sync_save_seconds(
        total, d.window_seconds, override=checkpoint_seconds, write_bandwidth=write_bandwidth
    )
    stall = dp.stall_seconds(sz.per_gpu_shard_bytes(total, d.gpus), override=stall_seconds)
    mtbf = None
    if failure_times is None:
        mtbf = dp.job_mtbf(d.gpus, mtbf_hours=mtbf_hours, gpu_mtbf_hours=gpu_mtbf_hours)
    return Scenario(
        work_seconds=run_days * sz.SECONDS_PER_DAY,
        interval_seconds=d.interval_seconds,
        write_seconds=write,
        checkpoint_bytes=total,
        gpus=d.gpus,
        gpu_hour_usd=gpu_hour_usd,
        mtbf_seconds=mtbf,
        failure_times=failure_times,
        mode=mode,
        snapshot_seconds=stall,
        restart_seconds=restart_seconds,
        corruption_probability=corruption_probability,
    )


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


def analytic_figures(sc: Scenario) -> dict[str, float | None]:
    """The closed-form figures beside the simulation (``simulate --json``'s ``analytic``).

    Young's and Daly's intervals take the stall as the cost; they are ``None``
    when failures are a given list (there is no MTBF).
    """
    m = sc.mtbf_seconds
    return {
        "expected_lost_seconds_per_failure": analytic_lost_seconds(sc),
        "young_interval_seconds": iv.young_interval(sc.stall_seconds, m) if m else None,
        "daly_interval_seconds": iv.daly_interval(sc.stall_seconds, m) if m else None,
    }


def lost_usd_per_failure(result: StrategyResult, gpu_hour_usd: float) -> float:
    """What one failure cost in lost GPU time, USD (0 when the runs met no failure)."""
    if not result.failures:
        return 0.0
    return result.lost_gpu_hours * gpu_hour_usd / result.failures


def peer_figures(sc: Scenario, strategy: StorageStrategy) -> dict[str, float | int | None]:
    """What a peer-memory strategy assumes and the closed form gives (``--json``'s ``peers``).

    Domains and the loss probability (:mod:`~mouthguard.plan.peers`), when a
    save lands in peer memory, the recovery from peers and from the durable tier
    (restart included), the expected loss per failure and the optimal interval;
    the last two are ``None`` where the closed form has no answer (failures given
    as a list, or losses with no durable copies). Raises :class:`ValueError`
    for a strategy without peer memory, or more copies than domains.
    """
    peers = strategy.peers
    if peers is None:
        raise ValueError(f"strategy {strategy.name!r} keeps no checkpoints in peer memory")
    loss = peers.loss_probability(sc.gpus)
    land = peers.write_seconds(sc.checkpoint_bytes, sc.gpus)
    stall = land if sc.mode == "sync" else sc.snapshot_seconds
    peer_read = peers.read_seconds(sc.checkpoint_bytes, sc.gpus)
    durable_read = sc.checkpoint_bytes / strategy.fast_read_bytes_per_s
    lost = optimal = None
    if peers.durable_every > 0 or loss == 0:
        lost = expected_lost_seconds_per_failure_peers(
            sc.interval_seconds + stall,
            0.0 if sc.mode == "sync" else land,
            peer_read,
            loss,
            peers.durable_every,
            sc.write_seconds,
            durable_read,
            sc.restart_seconds,
        )
        if sc.mtbf_seconds is not None:
            optimal = optimal_interval_peers(stall, sc.mtbf_seconds, loss, peers.durable_every)
    return {
        "replication": peers.replication,
        "domains": peers.domains(sc.gpus),
        "failed_domains": min(peers.failed_domains, peers.domains(sc.gpus)),
        "durable_every": peers.durable_every,
        "link_bytes_per_s": peers.link_bytes_per_s,
        "loss_probability": loss,
        "save_seconds": land,
        "stall_seconds": stall,
        "recovery_from_peers_seconds": sc.restart_seconds + peer_read,
        "recovery_from_durable_seconds": sc.restart_seconds + durable_read,
        "expected_lost_seconds_per_failure": lost,
        "optimal_interval_seconds": optimal,
    }
