"""Shared rendering helpers for the CLI (sizes, durations, tables)."""

from __future__ import annotations

import datetime as dt


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_time(when: dt.datetime) -> str:
    """A compact local timestamp."""
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")
