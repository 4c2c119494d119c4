"""How often to checkpoint: failure rates, lost work and the optimal interval.

All times are in seconds (``*_hours`` arguments excepted, as named). Every
function is pure arithmetic and raises :class:`ValueError` on input outside its
domain (negative durations, a non-positive MTBF or GPU count).

The model, stated once so every function here agrees with it:

* A synchronous run alternates ``T`` seconds of compute (the *interval*) with
  ``C`` seconds of checkpointing during which training is blocked; a cycle is
  ``T + C`` long. ``T`` is compute between checkpoints, the convention of Young
  (1974) and Daly (2006), so their formulas below return ``T``, not ``T + C``.
* Failures of the whole job arrive as a Poisson process with mean time between
  failures ``M`` (the job MTBF). A GPU failure stops the whole synchronous job,
  so the job MTBF is the per-GPU MTBF divided by the GPU count.
* A failure costs the wall time since the last *committed* checkpoint plus a
  restart ``R`` (reschedule, reload, warm-up).
* Asynchronous saving blocks training only for the snapshot (the *stall* ``S``,
  a device-to-host copy); the write to storage (``W`` seconds) overlaps compute.
  So ``S``, not ``W``, is the cost that enters Young's and Daly's formulas;
  ``W`` still matters because a checkpoint only protects once it has landed.
"""

from __future__ import annotations

import math

__all__ = [
    "daly_interval",
    "expected_failures",
    "expected_lost_seconds_per_failure",
    "expected_lost_seconds_per_failure_async",
    "expected_segment_seconds",
    "job_mtbf_seconds",
    "min_async_interval",
    "waste_fraction",
    "young_interval",
]

_HOUR = 3600.0


def _non_negative(name: str, value: float) -> None:
    # `not value >= 0` also rejects NaN, which would otherwise poison every result.
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def _positive(name: str, value: float) -> None:
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's first-order optimal compute interval between checkpoints, in seconds.

    ``sqrt(2 * C * M)`` with ``C`` the blocking checkpoint cost and ``M`` the job
    MTBF. It minimises the first-order waste ``C/T + T/(2M)`` and is accurate
    while ``C`` is much smaller than ``M``.
    """
    _non_negative("checkpoint_seconds", checkpoint_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    return math.sqrt(2.0 * checkpoint_seconds * mtbf_seconds)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimal compute interval between checkpoints, in seconds.

    For ``C < 2M``::

        sqrt(2CM) * (1 + (1/3) * sqrt(C / (2M)) + (1/9) * (C / (2M))) - C

    and ``M`` otherwise (Daly, "A higher order estimate of the optimum checkpoint
    interval for restart dumps", FGCS 2006). It approximates the minimum of the
    exponential-failure waste (:func:`waste_fraction`) better than Young's
    formula once ``C/M`` is not tiny, and tends to Young's as ``C/M -> 0``.
    """
    _non_negative("checkpoint_seconds", checkpoint_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    c, m = checkpoint_seconds, mtbf_seconds
    if c >= 2.0 * m:
        return m
    ratio = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - c


def expected_lost_seconds_per_failure(
    interval_seconds: float, checkpoint_seconds: float, restart_seconds: float = 0.0
) -> float:
    """Expected wall seconds lost to one failure of a synchronous job: ``(T + C)/2 + R``.

    A failure strikes at a uniformly random point of a ``T + C`` cycle, so on
    average half a cycle has passed since the last committed checkpoint. The
    in-flight checkpoint time *counts*: a failure during the write loses that
    write and all the compute before it. ``R`` (restart) is added in full.
    Multiply by the GPU count for GPU-seconds. First-order: assumes
    ``T + C`` is small next to the MTBF (at most one failure per cycle).
    """
    _non_negative("interval_seconds", interval_seconds)
    _non_negative("checkpoint_seconds", checkpoint_seconds)
    _non_negative("restart_seconds", restart_seconds)
    return (interval_seconds + checkpoint_seconds) / 2.0 + restart_seconds


def expected_lost_seconds_per_failure_async(
    interval_seconds: float,
    stall_seconds: float,
    write_seconds: float,
    restart_seconds: float = 0.0,
) -> float:
    """Expected wall seconds lost to one failure with asynchronous saving: ``(T+S)/2 + W + R``.

    The cycle is ``T + S`` (compute plus the snapshot stall). A checkpoint only
    protects once its background write has landed, ``W`` seconds after the
    snapshot; a failure inside that window falls back one more checkpoint and
    loses a whole extra cycle. Averaged over a uniform failure time that adds
    exactly ``W`` (requires ``W <= T + S``: one write in flight at a time, see
    :func:`min_async_interval`).
    """
    _non_negative("interval_seconds", interval_seconds)
    _non_negative("stall_seconds", stall_seconds)
    _non_negative("write_seconds", write_seconds)
    _non_negative("restart_seconds", restart_seconds)
    return (interval_seconds + stall_seconds) / 2.0 + write_seconds + restart_seconds


def min_async_interval(stall_seconds: float, write_seconds: float) -> float:
    """The shortest compute interval, in seconds, at which async writes do not queue up.

    With one staging buffer the next snapshot waits for the previous write to
    land, so ``T + S >= W``; below this the "async" save stalls anyway.
    """
    _non_negative("stall_seconds", stall_seconds)
    _non_negative("write_seconds", write_seconds)
    return max(0.0, write_seconds - stall_seconds)


def expected_failures(run_seconds: float, mtbf_seconds: float) -> float:
    """Expected number of failures in ``run_seconds`` of wall time: ``run / MTBF``.

    The mean of the Poisson count; the run length is wall time, so pass the
    run's duration including checkpoint and recovery overheads if known.
    """
    _non_negative("run_seconds", run_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    return run_seconds / mtbf_seconds


def job_mtbf_seconds(
    *,
    job_mtbf_hours: float | None = None,
    gpu_mtbf_hours: float | None = None,
    gpus: int = 1,
) -> float:
    """The job's MTBF in seconds, from exactly one of a job MTBF or a per-GPU MTBF.

    A synchronous job stops when any of its GPUs fails, and independent
    exponential failure rates add, so ``job MTBF = GPU MTBF / gpus``. ``gpus``
    is ignored when ``job_mtbf_hours`` is given. Raises :class:`ValueError`
    when both or neither are given, or a value is out of range.
    """
    if (job_mtbf_hours is None) == (gpu_mtbf_hours is None):
        raise ValueError("give exactly one of job_mtbf_hours or gpu_mtbf_hours")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
    if job_mtbf_hours is not None:
        _positive("job_mtbf_hours", job_mtbf_hours)
        return job_mtbf_hours * _HOUR
    assert gpu_mtbf_hours is not None
    _positive("gpu_mtbf_hours", gpu_mtbf_hours)
    return gpu_mtbf_hours * _HOUR / gpus


def expected_segment_seconds(
    interval_seconds: float,
    checkpoint_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
) -> float:
    """Expected wall seconds to complete one ``T``-second segment plus its checkpoint.

    The exact result for Poisson failures that may also strike during the
    checkpoint and the restart (Daly 2006, eq. 13):
    ``M * exp(R/M) * (exp((T + C)/M) - 1)``. Returns ``inf`` when it overflows.
    """
    _non_negative("interval_seconds", interval_seconds)
    _non_negative("checkpoint_seconds", checkpoint_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    _non_negative("restart_seconds", restart_seconds)
    exponent = (interval_seconds + checkpoint_seconds) / mtbf_seconds
    if exponent + restart_seconds / mtbf_seconds > 700.0:  # exp() overflows near 709
        return math.inf
    return mtbf_seconds * math.exp(restart_seconds / mtbf_seconds) * math.expm1(exponent)


def waste_fraction(
    interval_seconds: float,
    checkpoint_seconds: float,
    mtbf_seconds: float,
    restart_seconds: float = 0.0,
) -> float:
    """Fraction of wall time not spent on useful compute, in ``[0, 1]``.

    ``1 - T / E`` with ``E`` from :func:`expected_segment_seconds`: checkpoint
    time, lost work and restarts together. Daly's interval approximates its
    minimum over ``T``; ``T = 0`` wastes everything.
    """
    _non_negative("interval_seconds", interval_seconds)
    _non_negative("checkpoint_seconds", checkpoint_seconds)
    _positive("mtbf_seconds", mtbf_seconds)
    _non_negative("restart_seconds", restart_seconds)
    if interval_seconds == 0:
        return 1.0
    segment = expected_segment_seconds(
        interval_seconds, checkpoint_seconds, mtbf_seconds, restart_seconds
    )
    return 1.0 - interval_seconds / segment
