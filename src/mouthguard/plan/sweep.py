"""Expected cost against the checkpoint interval: the grid, the curves, their optima.

``mouthguard simulate --plot`` simulates the scenario at :data:`SWEEP_POINTS`
intervals spaced evenly on a log scale around the analytic optimum
(:func:`sweep_grid`), one :class:`Curve` per strategy (:func:`cost_curves`).
Drawing them is :mod:`mouthguard.plan.plot`'s job, the only module here that
needs matplotlib; this one is pure arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mouthguard.plan import intervals as iv
from mouthguard.plan.simulate import Scenario, sweep_intervals
from mouthguard.plan.strategies import StorageStrategy

__all__ = ["SWEEP_POINTS", "SWEEP_SPAN", "Curve", "cost_curves", "optimum", "sweep_grid"]

SWEEP_POINTS = 25
SWEEP_SPAN = 8.0  # the sweep covers centre / SPAN .. centre * SPAN
#: The sweep is centred no lower than this, seconds: shorter intervals are all stall.
_MIN_CENTRE_SECONDS = 60.0
#: No interval swept is shorter than this, seconds.
_MIN_SECONDS = 1.0


@dataclass(frozen=True)
class Curve:
    """One strategy's expected cost at each interval.

    Attributes:
        label: the strategy name (also picks its colour in the chart).
        intervals_seconds: checkpoint intervals, seconds, increasing.
        cost_usd: expected cost of the run at each interval, USD.
    """

    label: str
    intervals_seconds: Sequence[float]
    cost_usd: Sequence[float]

    def __post_init__(self) -> None:
        if len(self.intervals_seconds) != len(self.cost_usd) or not self.cost_usd:
            raise ValueError("a curve needs as many costs as intervals, at least one")


def optimum(curve: Curve) -> tuple[float, float]:
    """``(interval_seconds, cost_usd)`` of the curve's cheapest point (the first if tied)."""
    best = min(range(len(curve.cost_usd)), key=curve.cost_usd.__getitem__)
    return curve.intervals_seconds[best], curve.cost_usd[best]


def sweep_grid(sc: Scenario, low_optimum: float | None = None) -> list[float]:
    """Log-spaced intervals, seconds, around the analytic optimum (or the given interval).

    The centre is Daly's interval for the stall (async: at least the write, since
    below it the next snapshot waits for the last write anyway), or the
    scenario's interval when failures are a given list; never under a minute.
    :data:`SWEEP_POINTS` points from centre / :data:`SWEEP_SPAN` to centre x
    SPAN; ``low_optimum`` (a strategy whose optimum is far shorter, as peer
    memory's) extends the grid downwards with the same spacing to that optimum
    / SPAN, never below a second.
    """
    centre = sc.interval_seconds
    if sc.mtbf_seconds is not None:
        centre = iv.daly_interval(sc.stall_seconds, sc.mtbf_seconds)
        if sc.mode == "async":
            centre = max(centre, sc.write_seconds)
    centre = max(centre, _MIN_CENTRE_SECONDS)
    lo, ratio = centre / SWEEP_SPAN, SWEEP_SPAN ** (2 / (SWEEP_POINTS - 1))
    grid = [lo * ratio**i for i in range(SWEEP_POINTS)]
    if low_optimum is not None:
        floor = max(low_optimum / SWEEP_SPAN, _MIN_SECONDS)
        extra = max(0, math.ceil(math.log(lo / floor) / math.log(ratio))) if floor < lo else 0
        grid = [lo / ratio**i for i in range(extra, 0, -1)] + grid
    return grid


def cost_curves(
    sc: Scenario,
    strategies: Sequence[StorageStrategy],
    grid: Sequence[float],
    *,
    seed: int = 0,
    runs: int = 1,
    on_point: Callable[[], None] | None = None,
) -> list[Curve]:
    """Each strategy's expected cost at every interval of ``grid``, in the order given.

    ``on_point`` is called after each interval (for a progress bar).
    """
    curves = sweep_intervals(sc, strategies, grid, seed=seed, runs=runs, on_point=on_point)
    return [Curve(name, grid, [r.cost_usd for r in rs]) for name, rs in curves.items()]
