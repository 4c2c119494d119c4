"""Sizing against the source documents' tables (each within 5%)."""

from __future__ import annotations

import pytest

from mouthguard.plan import sizing as sz

GB, TB, PB = 1e9, 1e12, 1e15
B70, T15 = 70_000_000_000, 15_000_000_000_000
#: The per-day table's accounting: 16-bit weights plus two 16-bit optimizer copies.
SIX_BYTES = sz.StateLayout(adam_m="bf16", adam_v="bf16", gradients=None)


def within(value: float, expected: float, rel: float = 0.05) -> bool:
    return value == pytest.approx(expected, rel=rel)


def test_default_layout_is_twelve_bytes_per_parameter() -> None:
    assert sz.DEFAULT_LAYOUT.bytes_per_parameter() == 12
    assert sz.StateLayout(master_weights="fp32").bytes_per_parameter() == 16
    assert SIX_BYTES.bytes_per_parameter() == 6


def test_llama3_70b_components() -> None:
    # Seed table "Llama 3 70B": weights 140 GB, Adam m 280 GB, v 280 GB, gradients 140 GB.
    parts = sz.checkpoint_components(B70)
    assert parts == {
        "weights": 140 * GB,
        "adam_m": 280 * GB,
        "adam_v": 280 * GB,
        "gradients": 140 * GB,
    }
    assert sz.checkpoint_bytes(B70) == 840 * GB  # "840GB per Checkpoint"


def test_15t_moe_components() -> None:
    # Seed table "15T MoE": 30 TB + 60 TB + 60 TB + 30 TB = ~180 TB.
    parts = sz.checkpoint_components(T15)
    assert parts["weights"] == 30 * TB and parts["adam_m"] == 60 * TB
    assert sz.checkpoint_bytes(T15) == 180 * TB


def test_per_gpu_shards() -> None:
    # "16,384 GPUs ... ~51MB" and "~32,768 GPUs ... ~5.5GB" per-GPU checkpoint shard.
    assert within(sz.per_gpu_shard_bytes(840 * GB, 16_384), 51e6)
    assert within(sz.per_gpu_shard_bytes(180 * TB, 32_768), 5.5 * GB)


def test_bandwidth_to_land_15t_in_five_minutes() -> None:
    # "180TB ... done in 5 minutes ... that's 600 GB/s of sustained write throughput".
    assert within(sz.bandwidth_for_window(180 * TB, 300), 600 * GB)
    assert within(sz.write_seconds(180 * TB, 600 * GB), 300)


def test_gpt3_write_throughput() -> None:
    # "1.4 TB / 100s = 14 GB/s" and the matching 100 s synchronous stall.
    assert within(sz.bandwidth_for_window(1.4 * TB, 100), 14 * GB)
    assert within(sz.write_seconds(1.4 * TB, 14 * GB), 100)


@pytest.mark.parametrize(
    ("parameters", "per_checkpoint", "per_day"),
    [
        # Per-day table at hourly saves: 7B 42 GB -> 1 TB/day; 70B 420 GB -> 10 TB/day;
        # 1T 6 TB -> 144 TB/day.
        (7_000_000_000, 42 * GB, 1 * TB),
        (B70, 420 * GB, 10 * TB),
        (1_000_000_000_000, 6 * TB, 144 * TB),
    ],
)
def test_per_day_volume_at_hourly_saves(
    parameters: int, per_checkpoint: float, per_day: float
) -> None:
    size = sz.checkpoint_bytes(parameters, SIX_BYTES)
    assert within(size, per_checkpoint)
    assert within(sz.write_bytes_over(size, 3600), per_day)
    assert sz.checkpoints_in(sz.SECONDS_PER_DAY, 3600) == 24


@pytest.mark.parametrize(
    ("size", "saves", "total"),
    [
        # "40-60 checkpoints ... 34-50TB of total checkpoint writes" (70B).
        (840 * GB, 40, 34 * TB),
        (840 * GB, 60, 50 * TB),
        # "50-100" checkpoints per run, "9-18PB" total (15T MoE).
        (180 * TB, 50, 9 * PB),
        (180 * TB, 100, 18 * PB),
    ],
)
def test_whole_run_volume(size: float, saves: int, total: float) -> None:
    interval = 1800.0
    assert within(sz.write_bytes_over(size, interval, saves * interval), total)


def test_three_month_run_at_quarter_hour_saves() -> None:
    # "~560 GB x 4 per hour x 24 hours x 90 days = ~4.8 PB".
    assert within(sz.write_bytes_over(560 * GB, 900, 90 * sz.SECONDS_PER_DAY), 4.8 * PB)


def test_burst_counts_inline_copies() -> None:
    assert sz.burst_bytes(840 * GB) == 840 * GB
    assert sz.burst_bytes(840 * GB, copies=2) == 1680 * GB


def test_snapshot_stall_uses_the_per_gpu_shard() -> None:
    shard = sz.per_gpu_shard_bytes(180 * TB, 32_768)
    assert sz.snapshot_stall_seconds(shard) == pytest.approx(shard / 25e9)
    assert sz.snapshot_stall_seconds(50 * GB, 10 * GB) == 5.0


def test_drive_endurance() -> None:
    # 10 drives of 1 TB at 1 DWPD; 5 TB a day is half a drive write a day each.
    wear = sz.drive_endurance(
        daily_bytes=5 * TB, run_bytes=50 * TB, drive_capacity_bytes=TB, dwpd=1.0, drives=10
    )
    assert wear.drive_writes_per_day == pytest.approx(0.5)
    assert wear.rated_fraction == pytest.approx(0.5)
    assert wear.run_drive_writes == pytest.approx(5.0)
    assert wear.run_fraction_of_life == pytest.approx(5.0 / (5 * 365))


@pytest.mark.parametrize(
    "call",
    [
        lambda: sz.checkpoint_bytes(0),
        lambda: sz.checkpoint_bytes(B70, sz.StateLayout(weights="int3")),
        lambda: sz.checkpoint_bytes(B70, sz.StateLayout(adam_m="none")),
        lambda: sz.per_gpu_shard_bytes(840 * GB, 0),
        lambda: sz.per_gpu_shard_bytes(-1, 8),
        lambda: sz.burst_bytes(1.0, copies=0),
        lambda: sz.write_seconds(1.0, 0),
        lambda: sz.bandwidth_for_window(1.0, float("nan")),
        lambda: sz.write_bytes_over(1.0, -5),
        lambda: sz.drive_endurance(daily_bytes=1, run_bytes=1, drive_capacity_bytes=0, dwpd=1),
    ],
)
def test_bad_input_is_a_value_error(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
