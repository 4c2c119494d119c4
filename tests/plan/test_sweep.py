"""The interval sweep behind ``simulate --plot``: the grid, the curves and their optima."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from mouthguard.plan import intervals as iv
from mouthguard.plan.simulate import Scenario
from mouthguard.plan.strategies import DEFAULT_STRATEGIES
from mouthguard.plan.sweep import SWEEP_POINTS, SWEEP_SPAN, Curve, cost_curves, optimum, sweep_grid

SC = Scenario(
    work_seconds=86_400.0,
    interval_seconds=1800.0,
    write_seconds=120.0,
    checkpoint_bytes=1e9,
    gpus=8,
    gpu_hour_usd=2.0,
    mtbf_seconds=6 * 3600.0,
)


def test_the_grid_is_log_spaced_around_dalys_interval() -> None:
    grid = sweep_grid(SC)
    assert len(grid) == SWEEP_POINTS
    ratios = [b / a for a, b in itertools.pairwise(grid)]
    assert ratios == pytest.approx([ratios[0]] * len(ratios))  # evenly spaced on a log axis
    centre = iv.daly_interval(SC.stall_seconds, SC.mtbf_seconds or 0.0)
    assert grid[SWEEP_POINTS // 2] == pytest.approx(centre)
    assert grid[0] == pytest.approx(centre / SWEEP_SPAN)
    assert grid[-1] == pytest.approx(centre * SWEEP_SPAN)


def test_the_grid_centre() -> None:
    # Given failure times: around the interval in use.
    listed = dataclasses.replace(SC, mtbf_seconds=None, failure_times=(3600.0,))
    assert sweep_grid(listed)[SWEEP_POINTS // 2] == pytest.approx(1800.0)
    # Async: not below the write (the next snapshot waits for it anyway).
    slow = dataclasses.replace(SC, mode="async", snapshot_seconds=0.01, write_seconds=5000.0)
    assert sweep_grid(slow)[SWEEP_POINTS // 2] == pytest.approx(5000.0)
    # Never centred under a minute.
    tiny = dataclasses.replace(SC, write_seconds=1e-6)
    assert sweep_grid(tiny)[SWEEP_POINTS // 2] == pytest.approx(60.0)


def test_one_curve_per_strategy_at_every_interval() -> None:
    grid = [900.0, 1800.0, 3600.0]
    points: list[None] = []
    two_nodes = dataclasses.replace(SC, gpus=16)  # peer memory needs a domain per copy
    curves = cost_curves(
        two_nodes, DEFAULT_STRATEGIES, grid, runs=2, on_point=lambda: points.append(None)
    )
    assert [c.label for c in curves] == [s.name for s in DEFAULT_STRATEGIES]
    assert all(list(c.intervals_seconds) == grid and len(c.cost_usd) == 3 for c in curves)
    assert all(cost > 0 and math.isfinite(cost) for c in curves for cost in c.cost_usd)
    assert len(points) == len(grid)


def test_the_optimum_is_the_cheapest_point_the_first_if_tied() -> None:
    assert optimum(Curve("x", [1.0, 2.0, 3.0], [5.0, 4.0, 6.0])) == (2.0, 4.0)
    assert optimum(Curve("x", [1.0, 2.0, 3.0], [4.0, 4.0, 6.0])) == (1.0, 4.0)


def test_a_curve_needs_a_cost_per_interval() -> None:
    with pytest.raises(ValueError):
        Curve("x", [1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        Curve("x", [], [])


def test_a_much_shorter_optimum_extends_the_grid_downwards_at_the_same_spacing() -> None:
    grid = sweep_grid(SC)
    longer = sweep_grid(SC, low_optimum=40.0)
    assert longer[-SWEEP_POINTS:] == pytest.approx(grid)
    assert longer[0] <= 40.0 / SWEEP_SPAN < longer[1]
    ratios = [b / a for a, b in itertools.pairwise(longer)]
    assert ratios == pytest.approx([ratios[0]] * len(ratios))
    assert sweep_grid(SC, low_optimum=1e9) == pytest.approx(grid)  # never shrinks it
    assert sweep_grid(SC, low_optimum=0.001)[0] >= 1.0 / ratios[0]  # nor below a second
