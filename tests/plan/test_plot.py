"""The cost-versus-interval chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from mouthguard.plan.plot import cost_vs_interval_figure, render_png
from mouthguard.plan.sweep import Curve

INTERVALS = [600.0, 1200.0, 2400.0, 4800.0]
CURVES = [
    Curve("importance", INTERVALS, [9e6, 6e6, 5e6, 7e6]),
    Curve("temperature", INTERVALS, [12e6, 9e6, 8e6, 9.5e6]),
    Curve("flat", INTERVALS, [9.5e6, 6.5e6, 5.5e6, 7.5e6]),
]


def test_one_curve_and_one_optimum_marker_per_strategy() -> None:
    fig = cost_vs_interval_figure(
        CURVES, title="t", subtitle="s", references=[(2000.0, "Daly"), (1800.0, "now")]
    )
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert [label for label in labels if label in {"importance", "temperature", "flat"}] == [
        "importance",
        "temperature",
        "flat",
    ]
    assert sum("optimum: 40 min" in label for label in labels) == 3
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 3 * 2 + 2
    assert "minutes" in ax.get_xlabel() and "US$" in ax.get_ylabel()


def test_png_is_written(tmp_path: Path) -> None:
    png = render_png(cost_vs_interval_figure(CURVES, title="expected cost"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    path = tmp_path / "cost.png"
    path.write_bytes(png)
    assert path.stat().st_size == len(png)


def test_nothing_to_plot_is_refused() -> None:
    with pytest.raises(ValueError):
        cost_vs_interval_figure([], title="nothing")
