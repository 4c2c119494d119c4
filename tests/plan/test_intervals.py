"""Young's and Daly's intervals, lost work and failure counts.

The waste model the optima are checked against is the exact one for Poisson
failures (Daly 2006): finishing ``T`` seconds of compute plus a ``C``-second
checkpoint takes ``M * (exp((T + C)/M) - 1)`` wall seconds on average, so the
overhead per unit of compute is ``f(T) = M * (exp((T + C)/M) - 1) / T - 1``.
"""

from __future__ import annotations

import math

import pytest

from mouthguard.plan import intervals as iv

HOUR, DAY = 3600.0, 86_400.0


def overhead(interval: float, cost: float, mtbf: float) -> float:
    """The stated waste model: extra wall seconds per second of useful compute."""
    return iv.expected_segment_seconds(interval, cost, mtbf) / interval - 1.0


def numeric_optimum(cost: float, mtbf: float) -> float:
    """Golden-section search of ``overhead`` over log(T) (it is unimodal there)."""
    lo, hi = math.log(mtbf * 1e-6), math.log(mtbf * 10)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if overhead(math.exp(a), cost, mtbf) < overhead(math.exp(b), cost, mtbf):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


def test_young_by_hand() -> None:
    # sqrt(2 * 300 * 86400) = sqrt(51,840,000) = 7200 exactly.
    assert iv.young_interval(300, DAY) == pytest.approx(7200.0)
    assert iv.young_interval(0, DAY) == 0.0


def test_daly_by_hand() -> None:
    # C/(2M) = 300/172800, whose square root is 1/24:
    # 7200 * (1 + 1/72 + (300/172800)/9) - 300 = 7200 + 100 + 1.3889 - 300.
    assert iv.daly_interval(300, DAY) == pytest.approx(7001.388888888, rel=1e-12)


def test_daly_caps_at_the_mtbf_when_checkpoints_are_long() -> None:
    assert iv.daly_interval(2 * HOUR, HOUR) == HOUR
    assert iv.daly_interval(10 * HOUR, HOUR) == HOUR


@pytest.mark.parametrize("ratio", [1e-2, 1e-4, 1e-6, 1e-8])
def test_daly_tends_to_young_as_cost_over_mtbf_vanishes(ratio: float) -> None:
    mtbf = DAY
    young, daly = iv.young_interval(ratio * mtbf, mtbf), iv.daly_interval(ratio * mtbf, mtbf)
    # Leading correction is -C + C/3 relative to sqrt(2CM): of order sqrt(C/M).
    assert abs(daly / young - 1) <= math.sqrt(ratio)


@pytest.mark.parametrize("ratio", [1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.2, 0.5, 1.0, 1.9])
def test_daly_wastes_no_more_than_young(ratio: float) -> None:
    mtbf = 12 * HOUR
    cost = ratio * mtbf
    best = numeric_optimum(cost, mtbf)
    young, daly = iv.young_interval(cost, mtbf), iv.daly_interval(cost, mtbf)
    floor = overhead(best, cost, mtbf)
    assert overhead(daly, cost, mtbf) <= overhead(young, cost, mtbf) * (1 + 1e-12)
    # Daly's estimate sits close to the true minimum: within 1% of the least overhead.
    assert overhead(daly, cost, mtbf) <= floor * 1.01
    assert abs(daly - best) <= abs(young - best) + 1e-9 * best


def test_waste_fraction_matches_the_overhead_model() -> None:
    t, c, m = 3600.0, 300.0, DAY
    assert iv.waste_fraction(t, c, m) == pytest.approx(1 - 1 / (1 + overhead(t, c, m)))
    assert iv.waste_fraction(0, c, m) == 1.0
    # A restart scales the segment by exp(R/M).
    assert iv.expected_segment_seconds(t, c, m, 600) == pytest.approx(
        iv.expected_segment_seconds(t, c, m) * math.exp(600 / m)
    )
    assert iv.expected_segment_seconds(1e6, c, 1.0) == math.inf


def test_lost_work_sync_by_hand_and_by_averaging() -> None:
    # (T + C)/2 + R: the in-flight checkpoint counts.
    assert iv.expected_lost_seconds_per_failure(3600, 300, 600) == 2550.0
    t, c = 1800.0, 120.0
    cycle = t + c
    # A failure u seconds into a cycle loses u (back to the last checkpoint's end).
    grid = [(k + 0.5) * cycle / 10_000 for k in range(10_000)]
    assert sum(grid) / len(grid) == pytest.approx(iv.expected_lost_seconds_per_failure(t, c))


def test_lost_work_async_by_averaging() -> None:
    t, stall, write = 1800.0, 0.5, 400.0
    cycle = t + stall
    # Within `write` seconds of a snapshot the newest checkpoint has not landed:
    # the job falls back one more cycle.
    grid = [(k + 0.5) * cycle / 10_000 for k in range(10_000)]
    lost = [u + cycle if u < write else u for u in grid]
    expected = iv.expected_lost_seconds_per_failure_async(t, stall, write)
    assert sum(lost) / len(lost) == pytest.approx(expected, rel=1e-4)  # grid step 0.18 s
    assert iv.expected_lost_seconds_per_failure_async(t, stall, write, 60) == expected + 60
    assert iv.min_async_interval(stall, write) == write - stall
    assert iv.min_async_interval(5.0, 1.0) == 0.0


def test_job_mtbf() -> None:
    assert iv.job_mtbf_seconds(job_mtbf_hours=12) == 12 * HOUR
    # One failure a day on 16,384 GPUs is a per-GPU MTBF of 16,384 days.
    assert iv.job_mtbf_seconds(gpu_mtbf_hours=16_384 * 24, gpus=16_384) == DAY
    with pytest.raises(ValueError, match="exactly one"):
        iv.job_mtbf_seconds()
    with pytest.raises(ValueError, match="exactly one"):
        iv.job_mtbf_seconds(job_mtbf_hours=1, gpu_mtbf_hours=1)
    with pytest.raises(ValueError, match="gpus"):
        iv.job_mtbf_seconds(gpu_mtbf_hours=1000, gpus=0)
    with pytest.raises(ValueError):
        iv.job_mtbf_seconds(job_mtbf_hours=-1)


def test_failures_over_a_14_day_run() -> None:
    # "1-2 failures per day ... Over a 14-day run, that's $4M to $15M", at the
    # $270K-$540K per-failure cost the same source quotes.
    few = iv.expected_failures(14 * DAY, DAY)
    many = iv.expected_failures(14 * DAY, DAY / 2)
    assert (few, many) == (14.0, 28.0)
    assert few * 300_000 == pytest.approx(4e6, rel=0.05)
    assert many * 540_000 == pytest.approx(15e6, rel=0.05)


@pytest.mark.parametrize(
    "call",
    [
        lambda: iv.young_interval(-1, DAY),
        lambda: iv.young_interval(1, 0),
        lambda: iv.daly_interval(float("nan"), DAY),
        lambda: iv.expected_failures(DAY, -1),
        lambda: iv.expected_lost_seconds_per_failure(-1, 0),
        lambda: iv.waste_fraction(1, 1, float("inf")),
    ],
)
def test_bad_input_is_a_value_error(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
