"""The expected-cost-versus-interval chart: one curve per storage strategy, optimum marked.

Rendering only: the curves come from :func:`mouthguard.plan.sweep.cost_curves`
and the caller decides where the image goes, so this module does no file I/O.
The only module of :mod:`mouthguard.plan` that imports matplotlib; nothing
imports it but a plot. It draws on a bare :class:`~matplotlib.figure.Figure`
with the Agg canvas -- never ``pyplot`` -- so it needs no display, keeps no
global figure state and is safe to call from tests and threads.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from mouthguard.plan.sweep import Curve, optimum

__all__ = ["cost_vs_interval_figure", "render", "render_png"]

_MINUTE = 60.0
# Fixed colours and dashes per strategy so the chart reads the same every time and
# survives greyscale printing and colour blindness (line style differs too).
# Optimum markers shrink down the list so that coinciding optima stay visible.
_STYLES: dict[str, tuple[str, str, str, float]] = {
    "importance": ("#1b7837", "-", "o", 12.0),
    "temperature": ("#c51b7d", "--", "D", 9.0),
    "flat": ("#2166ac", ":", "s", 6.5),
    "peers": ("#e08214", "-.", "^", 9.0),
}
_FALLBACK_COLOURS = ("#762a83", "#8c510a", "#4d4d4d")
_TICKS_MINUTES = (
    0.1,
    0.25,
    0.5,
    1,
    2,
    3,
    5,
    10,
    15,
    20,
    30,
    45,
    60,
    90,
    120,
    180,
    240,
    360,
    480,
    720,
    1440,
    2880,
)


def _minutes(seconds: float) -> str:
    if seconds < 2 * _MINUTE:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / _MINUTE:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _money(usd: float) -> str:
    if abs(usd) >= 1e6 - 500:  # $999,600 reads $1.00M, not $1000K
        return f"${usd / 1e6:.2f}M"
    return f"${usd / 1e3:.0f}K"


def _draw(ax: Axes, curves: Sequence[Curve]) -> tuple[float, float]:
    """Draw the curves and their optima; returns the lowest and highest optimum cost."""
    lowest, highest = math.inf, 0.0
    for n, curve in enumerate(curves):
        colour, dash, marker, size = _STYLES.get(
            curve.label, (_FALLBACK_COLOURS[n % 3], "-.", "^", 8.0)
        )
        minutes = [s / _MINUTE for s in curve.intervals_seconds]
        millions = [c / 1e6 for c in curve.cost_usd]
        best_s, best_usd = optimum(curve)
        lowest, highest = min(lowest, best_usd), max(highest, best_usd)
        ax.plot(minutes, millions, dash, color=colour, linewidth=2.2, label=curve.label)
        ax.plot(
            [best_s / _MINUTE],
            [best_usd / 1e6],
            marker,
            color=colour,
            markersize=size,
            markeredgecolor="black",
            zorder=5,
            label=f"{curve.label} optimum: {_minutes(best_s)}, {_money(best_usd)}",
        )
    return lowest, highest


def cost_vs_interval_figure(
    curves: Sequence[Curve],
    *,
    title: str,
    subtitle: str = "",
    references: Sequence[tuple[float, str]] = (),
) -> Figure:
    """The chart as a matplotlib figure: cost ($M, linear) over interval (minutes, log).

    One line per curve plus one marker at each curve's optimum (two legend
    entries per curve). Each ``(seconds, label)`` of ``references`` adds a
    grey vertical line (the analytic optimum, the interval in use). The y axis is
    cut at three times the lowest optimum (or 1.5 times the highest, when that
    is higher: every optimum stays in view) so that short intervals, whose
    stalls dwarf everything, do not flatten the interesting part.
    """
    if not curves:
        raise ValueError("nothing to plot: no curves")
    fig = Figure(figsize=(10, 6.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lowest, highest = _draw(ax, curves)
    for (seconds, label), dash in zip(references, ("-.", (0, (1, 3)), "--"), strict=False):
        ax.axvline(seconds / _MINUTE, color="#555555", linewidth=1.3, linestyle=dash)
        ax.plot([], [], linestyle=dash, color="#555555", label=f"{label}: {_minutes(seconds)}")
    ax.set_xscale("log")
    lo = min(min(c.intervals_seconds) for c in curves) / _MINUTE
    hi = max(max(c.intervals_seconds) for c in curves) / _MINUTE
    ax.set_xlim(lo, hi)
    # Round minute values a reader can find on the axis (a bare log axis labels
    # only powers of ten).
    ax.xaxis.set_major_locator(FixedLocator([m for m in _TICKS_MINUTES if lo <= m <= hi]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("checkpoint interval (minutes of compute between saves, log scale)", fontsize=11)
    ax.set_ylabel("expected cost per run (US$ millions)", fontsize=11)
    top = max(max(c.cost_usd) for c in curves) / 1e6
    cut = max(3 * lowest, 1.5 * highest) / 1e6
    ax.set_ylim(0, min(top * 1.05, cut) if lowest > 0 else top * 1.05 or 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"${y:,.1f}M"))
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="x", alpha=0.12)
    # Top left, short intervals' stalls have sent the storage curves off the cut
    # axis and peer memory's curve runs along the bottom: the legend hides no data.
    ax.legend(loc="upper left", fontsize=9.5, framealpha=0.95, ncols=2)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 120), fontsize=9.5, color="#333333")
    return fig


def render(fig: Figure, fmt: str) -> bytes:
    """The figure as bytes of the matplotlib format ``fmt`` (``png``, ``svg``, ``pdf``, ...).

    No display is needed: Agg draws raster formats, vector formats use their own canvas.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt)
    return buffer.getvalue()


def render_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg, no display needed)."""
    return render(fig, "png")
