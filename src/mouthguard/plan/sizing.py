"""Checkpoint sizing: bytes by component, per-GPU shards, bursts, bandwidth and wear.

Units: bytes, seconds, bytes per second; sizes are decimal (1 GB = 1e9 B) as
the storage figures they are compared with. Functions are pure and raise
:class:`ValueError` for out-of-range input.

The default state layout is bf16 weights, fp32 Adam ``m`` and ``v``, and bf16
gradients: 2 + 4 + 4 + 2 = **12 bytes per parameter**, the accounting that gives
840 GB for a 70B model (140 + 280 + 280 + 140 GB) and 180 TB for 15T. Mixed
precision trainers that keep fp32 master weights add 4 bytes per parameter
(``master_weights="fp32"``, 16 B/param); saving only weights and a 16-bit
optimizer (``adam_m=adam_v="bf16"``, no gradients) gives the 6 B/param of the
per-day volume table (70B: 420 GB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LAYOUT",
    "DEFAULT_SNAPSHOT_BYTES_PER_S",
    "DTYPE_BYTES",
    "SECONDS_PER_DAY",
    "Endurance",
    "StateLayout",
    "bandwidth_for_window",
    "burst_bytes",
    "checkpoint_bytes",
    "checkpoint_components",
    "checkpoints_in",
    "drive_endurance",
    "per_gpu_shard_bytes",
    "snapshot_stall_seconds",
    "write_bytes_over",
    "write_seconds",
]

SECONDS_PER_DAY = 86_400.0

#: Bytes per element of each dtype a checkpoint component may be stored in.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: Per-GPU device-to-host copy rate assumed for an async snapshot, in bytes/s:
#: the ~25 GB/s an H100 moves over PCIe Gen5. The snapshot is the only part of
#: an async save that blocks training, so this sets the async stall.
DEFAULT_SNAPSHOT_BYTES_PER_S = 25e9


def _check(name: str, value: float, *, positive: bool = False) -> None:
    ok = value > 0 if positive else value >= 0
    # `not ok` also catches NaN; inf would silently turn every result into inf or 0.
    if not ok or math.isinf(value):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")


def _dtype(component: str, dtype: str | None, *, optional: bool) -> int:
    if dtype is None or dtype == "none":
        if optional:
            return 0
        raise ValueError(f"{component} must have a dtype")
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        known = ", ".join(DTYPE_BYTES)
        raise ValueError(f"unknown dtype {dtype!r} for {component} (known: {known})") from None


@dataclass(frozen=True)
class StateLayout:
    """Which per-parameter tensors a checkpoint holds, and in which dtype.

    ``None`` (or ``"none"``) leaves an optional component out. Weights and the
    two Adam moments are always saved: without them training cannot resume.
    """

    weights: str = "bf16"
    adam_m: str = "fp32"
    adam_v: str = "fp32"
    gradients: str | None = "bf16"
    master_weights: str | None = None

    def bytes_by_component(self) -> dict[str, int]:
        """Bytes per parameter of each saved component, in display order (absent ones left out).

        Raises :class:`ValueError` for an unknown dtype or a required one missing.
        """
        sizes = {
            "weights": _dtype("weights", self.weights, optional=False),
            "adam_m": _dtype("adam_m", self.adam_m, optional=False),
            "adam_v": _dtype("adam_v", self.adam_v, optional=False),
            "gradients": _dtype("gradients", self.gradients, optional=True),
            "master_weights": _dtype("master_weights", self.master_weights, optional=True),
        }
        return {name: size for name, size in sizes.items() if size}

    def bytes_per_parameter(self) -> int:
        """Total checkpoint bytes per model parameter."""
        return sum(self.bytes_by_component().values())


#: 12 B/param: bf16 weights + fp32 Adam m, v + bf16 gradients (70B -> 840 GB).
DEFAULT_LAYOUT = StateLayout()


def checkpoint_components(parameters: int, layout: StateLayout = DEFAULT_LAYOUT) -> dict[str, int]:
    """Bytes of each component of one full checkpoint of a ``parameters``-parameter model."""
    if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 1:
        raise ValueError(f"parameters must be an integer >= 1, got {parameters!r}")
    return {name: parameters * size for name, size in layout.bytes_by_component().items()}


def checkpoint_bytes(parameters: int, layout: StateLayout = DEFAULT_LAYOUT) -> int:
    """Bytes of one full checkpoint (all components; small non-tensor state is ignored)."""
    return sum(checkpoint_components(parameters, layout).values())


def per_gpu_shard_bytes(total_bytes: float, gpus: int) -> float:
    """Bytes each GPU writes when the state is sharded evenly over ``gpus`` (ZeRO/FSDP style).

    Replicated data-parallel copies are not written twice: each rank saves only
    its own shard, so the shard is the total divided by every GPU in the job.
    """
    _check("total_bytes", total_bytes)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
    return total_bytes / gpus


def burst_bytes(total_bytes: float, copies: int = 1) -> float:
    """Bytes storage must absorb per save: the checkpoint times the copies written inline.

    ``copies`` counts replicas written in the save itself (2 for an RF2 tier that
    replicates synchronously); copies made later by background replication are
    not part of the burst.
    """
    _check("total_bytes", total_bytes)
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an integer >= 1, got {copies!r}")
    return total_bytes * copies


def write_seconds(nbytes: float, bytes_per_second: float) -> float:
    """Seconds to land ``nbytes`` at an aggregate write bandwidth of ``bytes_per_second``."""
    _check("nbytes", nbytes)
    _check("bytes_per_second", bytes_per_second, positive=True)
    return nbytes / bytes_per_second


def bandwidth_for_window(nbytes: float, window_seconds: float) -> float:
    """Aggregate write bandwidth, in bytes/s, that lands ``nbytes`` within ``window_seconds``."""
    _check("nbytes", nbytes)
    _check("window_seconds", window_seconds, positive=True)
    return nbytes / window_seconds


def snapshot_stall_seconds(
    shard_bytes: float, snapshot_bytes_per_s: float = DEFAULT_SNAPSHOT_BYTES_PER_S
) -> float:
    """Seconds an async save blocks training: one GPU's shard copied to host memory.

    All GPUs copy their shards in parallel, so the per-GPU shard and the per-GPU
    copy rate set the stall, whatever the cluster size.
    """
    _check("shard_bytes", shard_bytes)
    _check("snapshot_bytes_per_s", snapshot_bytes_per_s, positive=True)
    return shard_bytes / snapshot_bytes_per_s


def checkpoints_in(duration_seconds: float, interval_seconds: float) -> float:
    """Saves in ``duration_seconds`` at one per ``interval_seconds`` (a rate, so fractional)."""
    _check("duration_seconds", duration_seconds)
    _check("interval_seconds", interval_seconds, positive=True)
    return duration_seconds / interval_seconds


def write_bytes_over(
    burst: float, interval_seconds: float, duration_seconds: float = SECONDS_PER_DAY
) -> float:
    """Bytes written over ``duration_seconds`` (default: one day) saving ``burst`` per interval."""
    _check("burst", burst)
    return burst * checkpoints_in(duration_seconds, interval_seconds)


@dataclass(frozen=True)
class Endurance:
    """How hard the checkpoint writes wear the drives beneath them.

    Attributes:
        drive_writes_per_day: full-capacity writes per day the checkpoints cause.
        rated_fraction: that, as a fraction of the rated DWPD (> 1 wears drives
            out before their warranty).
        run_drive_writes: full-capacity writes over the whole run.
        run_fraction_of_life: the run's writes as a fraction of the drives'
            total rated writes (capacity x DWPD x warranty days).
    """

    drive_writes_per_day: float
    rated_fraction: float
    run_drive_writes: float
    run_fraction_of_life: float


def drive_endurance(
    *,
    daily_bytes: float,
    run_bytes: float,
    drive_capacity_bytes: float,
    dwpd: float,
    drives: int = 1,
    warranty_years: float = 5.0,
) -> Endurance:
    """Drive endurance the checkpoint writes use, assuming they spread evenly over ``drives``.

    Write amplification inside the drive (and parity of erasure coding) is not
    modelled: pass the bytes that reach the drives (``copies`` already counted).
    """
    _check("daily_bytes", daily_bytes)
    _check("run_bytes", run_bytes)
    _check("drive_capacity_bytes", drive_capacity_bytes, positive=True)
    _check("dwpd", dwpd, positive=True)
    _check("warranty_years", warranty_years, positive=True)
    if isinstance(drives, bool) or not isinstance(drives, int) or drives < 1:
        raise ValueError(f"drives must be an integer >= 1, got {drives!r}")
    capacity = drive_capacity_bytes * drives
    per_day = daily_bytes / capacity
    run = run_bytes / capacity
    return Endurance(
        drive_writes_per_day=per_day,
        rated_fraction=per_day / dwpd,
        run_drive_writes=run,
        run_fraction_of_life=run / (dwpd * warranty_years * 365.0),
    )
