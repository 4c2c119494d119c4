"""The failure simulator: exact timelines, determinism, convergence to the analytic model."""

from __future__ import annotations

import dataclasses

import pytest

from mouthguard.plan.intervals import (
    expected_failures,
    expected_lost_seconds_per_failure,
    expected_lost_seconds_per_failure_async,
)
from mouthguard.plan.simulate import Scenario, simulate, simulate_run, sweep_intervals
from mouthguard.plan.strategies import (
    DEFAULT_STRATEGIES,
    FLAT,
    IMPORTANCE,
    TEMPERATURE,
    StorageStrategy,
    get_strategy,
)

HOUR, DAY = 3600.0, 86_400.0

# A small timeline to check by hand: 1000 s of work, a save every 100 s taking
# 10 s (sync), restart 5 s, nothing to read (0 bytes) unless a test says so.
TINY = Scenario(
    work_seconds=1000.0,
    interval_seconds=100.0,
    write_seconds=10.0,
    checkpoint_bytes=0.0,
    failure_times=(250.0,),
    restart_seconds=5.0,
)

# The Llama 3 70B case of docs/economics.md: 840 GB, 2-minute saves every 30 minutes, 1.5
# failures a day, 14 days.
LLAMA = Scenario(
    work_seconds=14 * DAY,
    interval_seconds=1800.0,
    write_seconds=120.0,
    checkpoint_bytes=840e9,
    gpus=16_384,
    gpu_hour_usd=30.0,
    mtbf_seconds=16 * HOUR,
    restart_seconds=300.0,
)


def test_no_failure_costs_only_the_stalls() -> None:
    r = simulate_run(dataclasses.replace(TINY, failure_times=()), FLAT)
    # nine saves (none after the last stretch of work), 10 s each
    assert (r.wall_seconds, r.lost_seconds, r.checkpoints) == (1090.0, 0.0, 9)
    assert r.overhead_seconds == 90.0


def test_failure_list_loses_exactly_what_the_timeline_says() -> None:
    # saves land at 110 and 220; the failure at 250 loses 30 s of work plus the 5 s restart
    r = simulate_run(TINY, FLAT)
    assert (r.lost_seconds, r.recovery_seconds, r.failures, r.fallbacks) == (35.0, 5.0, 1, 0)
    assert r.wall_seconds == 1090.0 + 35.0
    assert r.overhead_seconds == 90.0  # the two saves before the failure were kept


def test_failure_before_the_first_save_restarts_from_scratch() -> None:
    r = simulate_run(dataclasses.replace(TINY, failure_times=(50.0,)), FLAT)
    assert r.lost_seconds == 55.0 and r.wall_seconds == 1090.0 + 55.0


def test_failure_during_recovery_starts_it_over() -> None:
    r = simulate_run(dataclasses.replace(TINY, failure_times=(250.0, 252.0)), FLAT)
    # 30 s of work, 2 s of the first restart, then a full 5 s restart
    assert (r.lost_seconds, r.recovery_seconds, r.failures) == (37.0, 7.0, 2)
    assert r.wall_seconds == 1090.0 + 37.0


def test_corruption_falls_back_under_every_strategy() -> None:
    # mouthguard does not read the primary back at write time, and a primary found
    # corrupt later cannot be repaired (replicas are copied from it): a resume
    # trips over it as on any platform.
    corrupt = dataclasses.replace(TINY, corruption_probability=1.0)
    flat = simulate_run(corrupt, FLAT)
    # both saves are bad: back to the start, 250 s of work lost
    assert (flat.lost_seconds, flat.fallbacks) == (255.0, 2)
    assert simulate_run(corrupt, IMPORTANCE) == flat


def test_demoted_checkpoint_is_read_from_the_slow_tier() -> None:
    strategy = StorageStrategy(
        "slow",
        "test",
        fast_read_bytes_per_s=10.0,
        slow_read_bytes_per_s=1.0,
        demote_after_seconds=20.0,
    )
    sc = dataclasses.replace(TINY, checkpoint_bytes=10.0)
    # the save that landed at 220 is 30 s old at 250: demoted, 10 s to read
    assert simulate_run(sc, strategy).lost_seconds == 30.0 + 5.0 + 10.0
    early = dataclasses.replace(sc, failure_times=(235.0,))  # 15 s old: still fast, 1 s
    assert simulate_run(early, strategy).lost_seconds == 15.0 + 5.0 + 1.0
    rebuild = dataclasses.replace(strategy, rebuild_probability=1.0, rebuild_mean_seconds=600.0)
    assert simulate_run(sc, rebuild).lost_seconds > 45.0


def test_async_checkpoint_protects_only_once_landed() -> None:
    sc = dataclasses.replace(
        TINY, mode="async", write_seconds=30.0, snapshot_seconds=2.0, failure_times=(220.0,)
    )
    # snapshots end at 102 and 204; the second lands at 234, after the failure,
    # so the resume uses the first: 220 - 102 = 118 s of work, plus the restart
    assert simulate_run(sc, FLAT).lost_seconds == 118.0 + 5.0


def test_deterministic_for_a_seed() -> None:
    sc = dataclasses.replace(LLAMA, corruption_probability=0.05)
    first = simulate(sc, DEFAULT_STRATEGIES, seed=7, runs=5)
    assert first == simulate(sc, DEFAULT_STRATEGIES, seed=7, runs=5)
    assert first != simulate(sc, DEFAULT_STRATEGIES, seed=8, runs=5)


def test_flat_converges_to_the_analytic_expectation() -> None:
    runs = 400
    result = simulate(LLAMA, [FLAT], seed=1, runs=runs)["flat"]
    lost_seconds = result.lost_gpu_hours * HOUR / LLAMA.gpus
    read = FLAT.read_seconds(LLAMA.checkpoint_bytes, demoted=False)
    per_failure = expected_lost_seconds_per_failure(1800.0, 120.0, 300.0 + read)
    assert lost_seconds / result.failures == pytest.approx(per_failure, rel=0.03)
    failures = expected_failures(result.wall_hours * HOUR, LLAMA.mtbf_seconds or 0.0)
    assert lost_seconds == pytest.approx(per_failure * failures, rel=0.05)


def test_flat_async_converges_to_the_analytic_expectation() -> None:
    sc = dataclasses.replace(LLAMA, mode="async", snapshot_seconds=5.0, write_seconds=300.0)
    result = simulate(sc, [FLAT], seed=2, runs=400)["flat"]
    lost_per_failure = result.lost_gpu_hours * HOUR / sc.gpus / result.failures
    read = FLAT.read_seconds(sc.checkpoint_bytes, demoted=False)
    expected = expected_lost_seconds_per_failure_async(1800.0, 5.0, 300.0, 300.0 + read)
    assert lost_per_failure == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("interval", [600.0, 1800.0, 3600.0])
def test_importance_never_worse_than_temperature_with_corruption(interval: float) -> None:
    sc = dataclasses.replace(LLAMA, interval_seconds=interval, corruption_probability=0.05)
    r = simulate(sc, DEFAULT_STRATEGIES, seed=3, runs=60)
    assert r["importance"].cost_usd <= r["temperature"].cost_usd
    assert r["importance"].lost_gpu_hours <= r["temperature"].lost_gpu_hours
    # Corruption costs importance fallbacks too: only demotion tells the two apart.
    assert r["importance"].fallbacks > 0 and r["temperature"].fallbacks > 0


@pytest.mark.parametrize("corruption", [0.0, 0.05])
def test_importance_equals_flat(corruption: float) -> None:
    # The model prices recovery only: what importance adds over one fast tier
    # (cheaper tiers for old checkpoints, replicas elsewhere) is not in it.
    sc = dataclasses.replace(LLAMA, corruption_probability=corruption)
    r = simulate(sc, [IMPORTANCE, FLAT], seed=4, runs=10)
    assert r["importance"].as_dict() == r["flat"].as_dict()


def test_async_stalls_less_than_sync() -> None:
    sync = simulate(LLAMA, [FLAT], seed=5, runs=20)["flat"]
    async_ = dataclasses.replace(LLAMA, mode="async", snapshot_seconds=0.5)
    result = simulate(async_, [FLAT], seed=5, runs=20)["flat"]
    assert result.overhead_gpu_hours < sync.overhead_gpu_hours
    assert result.goodput > sync.goodput


def test_sweep_gives_one_result_per_interval() -> None:
    calls: list[None] = []
    curves = sweep_intervals(
        LLAMA,
        DEFAULT_STRATEGIES,
        [900.0, 1800.0, 3600.0],
        runs=3,
        on_point=lambda: calls.append(None),
    )
    assert list(curves) == ["importance", "temperature", "flat", "peers"]
    assert all(len(results) == 3 for results in curves.values()) and len(calls) == 3


@pytest.mark.parametrize(
    "change",
    [
        {"interval_seconds": 0.0},
        {"work_seconds": float("nan")},
        {"corruption_probability": 1.5},
        {"gpus": 0},
        {"mtbf_seconds": None},
        {"failure_times": (5.0,)},  # both an MTBF and a list
        {"mode": "later"},
    ],
)
def test_bad_scenario_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(LLAMA, **change)  # type: ignore[arg-type]


def test_bad_runs_and_unfinishable_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="runs"):
        simulate(LLAMA, [FLAT], runs=0)
    hopeless = dataclasses.replace(LLAMA, mtbf_seconds=60.0)  # a failure a minute, 30-min saves
    with pytest.raises(ValueError, match="did not finish"):
        simulate_run(hopeless, FLAT)
    with pytest.raises(ValueError, match="unknown strategy"):
        get_strategy("lukewarm")
    assert get_strategy("temperature") is TEMPERATURE
