"""The training run a question is about: model, cluster and the defaults that fill the gaps.

``mouthguard plan`` and ``mouthguard simulate`` answer different questions about
the same run, so they must resolve it the same way or their numbers disagree.
Each figure comes from, in order: the caller (an option), the model's preset
(:mod:`mouthguard.plan.presets`, only what a source states), then the documented
default below. The same rule picks the blocking cost of a synchronous save
(:func:`sync_save_seconds`), the stall of an async one (:func:`stall_seconds`)
and the job's MTBF (:func:`job_mtbf`).

Units: seconds, bytes, bytes per second, as in :mod:`mouthguard.plan.sizing`.
Pure arithmetic: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from mouthguard.plan import intervals as iv
from mouthguard.plan import sizing as sz
from mouthguard.plan.presets import resolve_model

__all__ = [
    "DEFAULT_CORRUPTION",
    "DEFAULT_DWPD",
    "DEFAULT_GPU_HOUR_USD",
    "DEFAULT_GPU_MTBF_HOURS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_RUN_DAYS",
    "DEFAULT_WARRANTY_YEARS",
    "DEFAULT_WINDOW_S",
    "Deployment",
    "MissingInputError",
    "job_mtbf",
    "resolve_deployment",
    "stall_seconds",
    "sync_save_seconds",
]

DEFAULT_INTERVAL_S = 1800.0  # "approximately every 30 minutes" (Llama 3 70B)
DEFAULT_WINDOW_S = 300.0  # land the checkpoint in 5 minutes so training does not stall
#: 1.5 failures a day (the middle of the reported 1-2) on a 16,384-GPU cluster.
DEFAULT_GPU_MTBF_HOURS = 16_384 * 24 / 1.5
DEFAULT_RUN_DAYS = 14.0  # the 14-day run of the failure-cost example
DEFAULT_DWPD = 1.0  # a read-intensive enterprise NVMe drive's rating
DEFAULT_WARRANTY_YEARS = 5.0  # the usual enterprise NVMe warranty
#: A commonly quoted rate, "$30/GPU-hour" for a 1,000-GPU job; it is also what makes
#: the often-cited $300K per failure of a 16,384-GPU job on a 30-minute schedule add up.
DEFAULT_GPU_HOUR_USD = 30.0
#: Silent corruption per checkpoint (an assumption: no published rate is used).
DEFAULT_CORRUPTION = 0.01


class MissingInputError(ValueError):
    """A figure the question needs is neither given nor in the model's preset.

    ``name`` is the figure's name as the caller passes it (``"gpus"``), so a
    command line can name its own option in the message.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class Deployment:
    """A model on a cluster, every figure resolved.

    Attributes:
        label: the preset's name, or ``"N parameters"`` for a bare count.
        parameters: total parameter count.
        gpus: GPUs in the job (>= 1).
        interval_seconds: compute seconds between saves.
        window_seconds: seconds a save should land in (sizes the storage when
            no bandwidth or save time is given).
    """

    label: str
    parameters: int
    gpus: int
    interval_seconds: float
    window_seconds: float


def resolve_deployment(
    model: str,
    *,
    gpus: int | None = None,
    interval_seconds: float | None = None,
    window_seconds: float | None = None,
) -> Deployment:
    """The deployment of ``model`` (a preset name or a parameter count, as ``70B``).

    Given figures win over the preset's, the preset's over the defaults.
    Raises :class:`ValueError` for an unknown model and :class:`MissingInputError`
    (``name="gpus"``) when no GPU count is given and the preset names none.
    """
    label, parameters, preset = resolve_model(model)
    if gpus is None and preset is not None:
        gpus = preset.gpus
    if gpus is None:
        raise MissingInputError("gpus", f"{label} names no GPU count")
    return Deployment(
        label=label,
        parameters=parameters,
        gpus=gpus,
        interval_seconds=_first(
            interval_seconds, preset.interval_seconds if preset else None, DEFAULT_INTERVAL_S
        ),
        window_seconds=_first(
            window_seconds, preset.window_seconds if preset else None, DEFAULT_WINDOW_S
        ),
    )


def sync_save_seconds(
    burst_bytes: float,
    window_seconds: float,
    *,
    override: float | None = None,
    write_bandwidth: float | None = None,
) -> tuple[float, str]:
    """The blocking cost ``C`` of a synchronous save, and where it came from.

    ``(override, "override")`` when given; else the time to land ``burst_bytes``
    at ``write_bandwidth`` (``"write_bandwidth"``); else the storage is assumed
    sized to land the burst exactly in ``window_seconds`` (``"window"``).
    """
    if override is not None:
        return override, "override"
    if write_bandwidth is not None:
        return sz.write_seconds(burst_bytes, write_bandwidth), "write_bandwidth"
    return window_seconds, "window"


def stall_seconds(
    shard_bytes: float,
    *,
    override: float | None = None,
    snapshot_bytes_per_s: float = sz.DEFAULT_SNAPSHOT_BYTES_PER_S,
) -> float:
    """The stall ``S`` of an async save: ``override``, else one GPU's shard copied to host."""
    if override is not None:
        return override
    return sz.snapshot_stall_seconds(shard_bytes, snapshot_bytes_per_s)


def job_mtbf(
    gpus: int, *, mtbf_hours: float | None = None, gpu_mtbf_hours: float | None = None
) -> float:
    """The job's MTBF in seconds: ``mtbf_hours`` (the job's) if given, else per GPU.

    The per-GPU MTBF is ``gpu_mtbf_hours``, else :data:`DEFAULT_GPU_MTBF_HOURS`;
    see :func:`~mouthguard.plan.intervals.job_mtbf_seconds`.
    """
    if mtbf_hours is not None:
        return iv.job_mtbf_seconds(job_mtbf_hours=mtbf_hours)
    per_gpu = gpu_mtbf_hours if gpu_mtbf_hours is not None else DEFAULT_GPU_MTBF_HOURS
    return iv.job_mtbf_seconds(gpu_mtbf_hours=per_gpu, gpus=gpus)


def _first(*values: float | None) -> float:
    """The first value that is given (the last is the default, always given)."""
    return next(v for v in values if v is not None)
