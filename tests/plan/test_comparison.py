"""What ``simulate`` compares: the scenario of a run, the closed form beside it, the strategies."""

from __future__ import annotations

import dataclasses

import pytest

from mouthguard.plan import comparison as cmp
from mouthguard.plan import deployment as dp
from mouthguard.plan.simulate import Scenario, StrategyResult
from mouthguard.plan.strategies import (
    DEFAULT_STRATEGIES,
    FAST_READ_BYTES_PER_S,
    FLAT,
    IMPORTANCE,
    PEERS,
    TEMPERATURE,
    with_rebuild,
)

GB = 1e9
LLAMA = dp.resolve_deployment("llama3-70b")


def test_the_default_scenario_of_llama3_70b() -> None:
    sc = cmp.scenario_for(LLAMA)
    assert sc.checkpoint_bytes == 840 * GB and sc.gpus == 16_384
    assert sc.interval_seconds == 1800.0
    assert sc.write_seconds == dp.DEFAULT_WINDOW_S  # storage sized to the window
    assert sc.snapshot_seconds == pytest.approx(840 * GB / 16_384 / 25e9)
    assert sc.mtbf_seconds == pytest.approx(dp.DEFAULT_GPU_MTBF_HOURS * 3600 / 16_384)
    assert sc.work_seconds == dp.DEFAULT_RUN_DAYS * 86_400
    assert (sc.gpu_hour_usd, sc.corruption_probability) == (30.0, 0.01)
    assert sc.mode == "sync" and sc.failure_times is None


def test_given_failure_times_replace_the_mtbf() -> None:
    sc = cmp.scenario_for(LLAMA, failure_times=(3600.0, 7200.0), mtbf_hours=5.0)
    assert sc.mtbf_seconds is None and sc.failure_times == (3600.0, 7200.0)


def test_the_write_comes_from_the_bandwidth_or_the_override() -> None:
    assert cmp.scenario_for(LLAMA, write_bandwidth=100 * GB).write_seconds == pytest.approx(8.4)
    assert cmp.scenario_for(LLAMA, checkpoint_seconds=7.0).write_seconds == 7.0


def test_the_scenario_refuses_what_it_cannot_simulate() -> None:
    with pytest.raises(ValueError, match="corruption probability"):
        cmp.scenario_for(LLAMA, corruption_probability=2.0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_analytic_lost_seconds_by_hand(mode: str) -> None:
    sc = Scenario(
        work_seconds=1e6,
        interval_seconds=1000.0,
        write_seconds=100.0,
        snapshot_seconds=10.0,
        checkpoint_bytes=FAST_READ_BYTES_PER_S * 20,  # a 20 s read from the flat tier
        restart_seconds=30.0,
        mtbf_seconds=86_400.0,
        mode=mode,  # type: ignore[arg-type]
    )
    expected = (1000 + 100) / 2 + 50 if mode == "sync" else (1000 + 10) / 2 + 100 + 50
    assert cmp.analytic_lost_seconds(sc) == pytest.approx(expected)
    figures = cmp.analytic_figures(sc)
    assert figures["expected_lost_seconds_per_failure"] == pytest.approx(expected)
    assert figures["daly_interval_seconds"] is not None


def test_no_optimum_without_an_mtbf() -> None:
    sc = cmp.scenario_for(LLAMA, failure_times=(3600.0,))
    figures = cmp.analytic_figures(sc)
    assert figures["young_interval_seconds"] is None and figures["daly_interval_seconds"] is None


def test_lost_usd_per_failure() -> None:
    result = StrategyResult("flat", 1, 0.0, 300.0, 0.0, 0.99, 3.0, 0.0, 100.0, 1.0)
    assert cmp.lost_usd_per_failure(result, 2.0) == pytest.approx(200.0)
    none = dataclasses.replace(result, failures=0.0, lost_gpu_hours=0.0)
    assert cmp.lost_usd_per_failure(none, 2.0) == 0.0


def test_rebuild_figures_change_only_the_strategy_that_demotes() -> None:
    changed = with_rebuild(DEFAULT_STRATEGIES, probability=0.9, mean_seconds=60.0)
    assert [s.name for s in changed] == [s.name for s in DEFAULT_STRATEGIES]
    importance, temperature, flat, peers = changed
    assert importance is IMPORTANCE and flat is FLAT and peers is PEERS
    assert (temperature.rebuild_probability, temperature.rebuild_mean_seconds) == (0.9, 60.0)
    only_mean = with_rebuild([TEMPERATURE], mean_seconds=5.0)[0]
    assert only_mean.rebuild_probability == TEMPERATURE.rebuild_probability
    assert with_rebuild(DEFAULT_STRATEGIES) == list(DEFAULT_STRATEGIES)
