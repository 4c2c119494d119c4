"""Run a replay where the page cache cannot hide the disk: a memory cgroup per process.

A store's disk tier only matters when its data does not fit in RAM. On a
machine with free memory the kernel's page cache keeps every file a store wrote,
so a "disk" read is a memory copy. :func:`confine` puts the calling process in
a fresh memory cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) capped
at its resident size now plus ``budget`` bytes; the page cache it fills is
charged to that cgroup, so everything it holds -- its own RAM tier, its
staging, and the page cache -- shares ``budget``. Needs root; returns why not
otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOT = Path("/sys/fs/cgroup/memory")


def confine(name: str, budget: int) -> str | None:
    """Move this process into a new cgroup capped at RSS + ``budget``; None or the reason."""
    limit = psutil.Process().memory_info().rss + budget
    if (V2_ROOT / "cgroup.controllers").exists():
        group, knob = V2_ROOT / name, "memory.max"
    elif V1_ROOT.is_dir():
        group, knob = V1_ROOT / name, "memory.limit_in_bytes"
    else:
        return "no memory cgroup controller on this machine"
    try:
        group.mkdir(exist_ok=True)
        (group / knob).write_text(str(limit))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        return f"cannot create a memory cgroup: {exc}"
    return None


def release(name: str) -> None:
    """Remove a cgroup left by :func:`confine` (its process has exited)."""
    for root in (V2_ROOT, V1_ROOT):
        try:
            (root / name).rmdir()
        except OSError:
            continue
