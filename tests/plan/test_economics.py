"""``checkpoint_economics``: the figures ``mouthguard plan`` prints, computed without the CLI."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mouthguard.plan import intervals as iv
from mouthguard.plan import sizing as sz
from mouthguard.plan.comparison import scenario_for
from mouthguard.plan.deployment import resolve_deployment
from mouthguard.plan.economics import PlanQuestion, checkpoint_economics
from mouthguard.plan.peers import PeerModel

GB, TB = 1e9, 1e12
LLAMA = resolve_deployment("llama3-70b")

#: The JSON output's keys, in order: scripts read them, so they change only on purpose.
KEYS = [
    "model",
    "parameters",
    "gpus",
    "bytes_per_parameter",
    "components_bytes",
    "checkpoint_bytes",
    "per_gpu_shard_bytes",
    "copies",
    "burst_bytes",
    "write_bandwidth_bytes_per_s",
    "time_to_land_s",
    "window_seconds",
    "bandwidth_needed_bytes_per_s",
    "interval_seconds",
    "checkpoints_per_day",
    "daily_write_bytes",
    "run_seconds",
    "checkpoints_per_run",
    "run_write_bytes",
    "mtbf_seconds",
    "expected_failures",
    "restart_seconds",
    "checkpoint_seconds",
    "checkpoint_seconds_source",
    "stall_seconds",
    "async_interval_queues",
    "optimal_interval_young_s",
    "optimal_interval_daly_s",
    "optimal_interval_young_async_s",
    "optimal_interval_daly_async_s",
    "waste_fraction_sync",
    "waste_fraction_at_daly_sync",
    *[
        f"{key}_{mode}"
        for mode in ("sync", "async")
        for key in (
            "expected_lost_seconds_per_failure",
            "lost_gpu_hours_per_failure",
            "lost_cost_usd_per_failure",
            "lost_gpu_hours_per_run",
            "lost_cost_usd_per_run",
            "checkpoint_gpu_hours_per_run",
            "checkpoint_cost_usd_per_run",
        )
    ],
    "peer_replication",
    "peer_domains",
    "peer_failed_domains",
    "peer_durable_every",
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
    "gpu_hour_usd",
    "drive_capacity_bytes",
    "drives",
    "dwpd",
    "drive_writes_per_day",
    "dwpd_used_fraction",
    "endurance_used_fraction_run",
]


def test_the_keys_and_their_order_are_the_outputs() -> None:
    assert list(checkpoint_economics(PlanQuestion(LLAMA))) == KEYS


def test_llama3_70b_by_hand() -> None:
    f = checkpoint_economics(PlanQuestion(LLAMA, write_bandwidth=100 * GB, mtbf_hours=16.0))
    assert f["checkpoint_bytes"] == 840 * GB
    assert f["components_bytes"] == {
        "weights": 140 * GB,
        "adam_m": 280 * GB,
        "adam_v": 280 * GB,
        "gradients": 140 * GB,
    }
    assert f["per_gpu_shard_bytes"] == pytest.approx(840 * GB / 16_384)
    cost, mtbf = f["checkpoint_seconds"], f["mtbf_seconds"]
    assert (cost, f["checkpoint_seconds_source"]) == (pytest.approx(8.4), "write_bandwidth")
    assert f["optimal_interval_young_s"] == pytest.approx(math.sqrt(2 * cost * mtbf))
    assert f["optimal_interval_daly_s"] == pytest.approx(iv.daly_interval(cost, mtbf))
    # 14 days at 16 h MTBF: 21 failures; a save every 30 min: 48 a day.
    assert f["expected_failures"] == pytest.approx(21.0)
    assert f["checkpoints_per_day"] == pytest.approx(48.0)


def test_copies_multiply_the_burst_not_the_checkpoint() -> None:
    f = checkpoint_economics(PlanQuestion(LLAMA, copies=2, write_bandwidth=100 * GB))
    assert f["burst_bytes"] == 2 * f["checkpoint_bytes"]
    assert f["time_to_land_s"] == pytest.approx(16.8)
    assert f["daily_write_bytes"] == pytest.approx(48 * 2 * 840 * GB)


def test_lost_work_and_its_price_per_mode() -> None:
    q = PlanQuestion(
        LLAMA, checkpoint_seconds=120.0, stall_seconds=2.0, restart_seconds=60.0, gpu_hour_usd=2.0
    )
    f = checkpoint_economics(q)
    # sync: (T + C)/2 + R; async: (T + S)/2 + W + R, with W the sync save's time.
    assert f["expected_lost_seconds_per_failure_sync"] == (1800 + 120) / 2 + 60
    assert f["expected_lost_seconds_per_failure_async"] == (1800 + 2) / 2 + 120 + 60
    per_failure = f["expected_lost_seconds_per_failure_sync"] * 16_384 / 3600 * 2.0
    assert f["lost_cost_usd_per_failure_sync"] == pytest.approx(per_failure)
    stalls = 2.0 * f["checkpoints_per_run"] * 16_384 / 3600
    assert f["checkpoint_gpu_hours_per_run_async"] == pytest.approx(stalls)


def test_figures_that_need_a_missing_input_are_none() -> None:
    f = checkpoint_economics(PlanQuestion(LLAMA))
    assert f["lost_cost_usd_per_failure_sync"] is None and f["gpu_hour_usd"] is None
    assert f["drive_writes_per_day"] is None and f["endurance_used_fraction_run"] is None
    assert f["time_to_land_s"] is None and f["checkpoint_seconds_source"] == "window"


def test_drive_endurance() -> None:
    f = checkpoint_economics(PlanQuestion(LLAMA, drive_capacity=30.72 * TB, drives=100, dwpd=2.0))
    per_day = f["daily_write_bytes"] / (100 * 30.72 * TB)
    assert f["drive_writes_per_day"] == pytest.approx(per_day)
    assert f["dwpd_used_fraction"] == pytest.approx(per_day / 2.0)


def test_async_queues_when_the_write_outlasts_the_interval() -> None:
    slow = PlanQuestion(LLAMA, checkpoint_seconds=4000.0, stall_seconds=1.0)
    f = checkpoint_economics(slow)
    assert f["async_interval_queues"] is True
    assert f["optimal_interval_daly_async_s"] >= 4000.0 - 1.0


def test_a_smaller_layout_shrinks_the_checkpoint() -> None:
    layout = sz.StateLayout(adam_m="bf16", adam_v="bf16", gradients=None)
    f = checkpoint_economics(PlanQuestion(LLAMA, layout=layout))
    assert f["bytes_per_parameter"] == 6 and f["checkpoint_bytes"] == 420 * GB


def test_plan_and_simulate_agree_on_the_run() -> None:
    """The two commands resolve one run the same way: same write, stall and MTBF."""
    for kwargs in ({}, {"write_bandwidth": 200 * GB}, {"checkpoint_seconds": 42.0}):
        f = checkpoint_economics(PlanQuestion(LLAMA, **kwargs))  # type: ignore[arg-type]
        sc = scenario_for(LLAMA, **kwargs)  # type: ignore[arg-type]
        assert sc.write_seconds == f["checkpoint_seconds"]
        assert sc.snapshot_seconds == f["stall_seconds"]
        assert sc.mtbf_seconds == f["mtbf_seconds"]
        assert sc.work_seconds == f["run_seconds"]
        assert sc.checkpoint_bytes == f["checkpoint_bytes"]


def test_the_peers_column_by_hand() -> None:
    q = PlanQuestion(
        LLAMA, checkpoint_seconds=120.0, restart_seconds=300.0, gpu_hour_usd=30.0, mtbf_hours=16.0
    )
    f = checkpoint_economics(q)
    stall = 840 * GB / 2048 / 25e9  # one copy of a node's share over its 25 GB/s link
    assert (f["peer_domains"], f["peer_loss_probability"]) == (2048, 0.0)
    assert f["stall_seconds_peers"] == pytest.approx(stall)
    assert f["expected_lost_seconds_per_failure_peers"] == pytest.approx((1800 + stall) / 2 + 300)
    assert f["optimal_interval_peers_s"] == pytest.approx(math.sqrt(2 * stall * 16 * 3600))
    # A failure taking two nodes loses a rank's both copies with probability 2/2047,
    # and then goes back to the newest of every 10th save, landed 120 s after it.
    two = checkpoint_economics(dataclasses.replace(q, peers=PeerModel(failed_domains=2)))
    p, cycle = 2 / 2047, 1800 + stall
    expected = (1 - p) * (cycle / 2 + 300) + p * (10 * cycle / 2 + 120 + 300)
    assert two["expected_lost_seconds_per_failure_peers"] == pytest.approx(expected)
    assert two["optimal_interval_peers_s"] == pytest.approx(
        math.sqrt(2 * stall * 16 * 3600 / (1 - p + p * 10))
    )


def test_the_peers_column_is_empty_without_enough_domains() -> None:
    one_node = resolve_deployment("7b", gpus=8)
    f = checkpoint_economics(PlanQuestion(one_node))
    assert f["peer_domains"] == 1 and f["peer_loss_probability"] is None
    assert f["optimal_interval_peers_s"] is None
    no_durable = PlanQuestion(LLAMA, peers=PeerModel(failed_domains=2, durable_every=0))
    g = checkpoint_economics(no_durable)
    assert g["peer_loss_probability"] > 0 and g["expected_lost_seconds_per_failure_peers"] is None
