"""CPU seconds spent during an epoch: by the loader, by the S3 server, by the whole machine.

On a small machine the loader's processes and the loopback S3 server share the
same CPUs, so a reader that spends more CPU per byte (hashing every byte, for
one) leaves less for the server it is reading from. A throughput figure alone
cannot tell that apart from a slower design; these three sums can:

* **loader**: the cell's process and every process under it (its DataLoader
  workers, a fork server, a ``curl`` a peer pipes through), each one's own
  user + system time plus that of the children it has reaped. Summed over the
  tree at the epoch's start and end, the difference counts a worker that
  started, or exited and was reaped, in between exactly once: a reaped
  process's time moves into its parent's "children" fields (``/proc/PID/stat``
  fields 16-17) and the process leaves ``/proc``.
* **server**: the same for every process whose command line names the S3
  server's directory (radosgw, the OSD, the monitor), the loader's tree left
  out (a cell's arguments name the server's log).
* **machine busy**: all CPUs' non-idle time from ``/proc/stat`` (every process
  on the machine, other users' included), beside the epoch's wall time times
  the CPU count, which is what the machine could have given.

Linux only (``/proc``); elsewhere every figure is None and the report says "-".
A process that exits and is reaped by a process outside the tree (none of the
readers measured does this) would be missed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class _Proc:
    ppid: int
    ticks: int  # own user + system, plus reaped children's user + system


def _read_proc(pid: int) -> _Proc | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None  # gone between the listing and the read
    # The command name (field 2) may hold spaces and parentheses: fields after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
    return _Proc(int(fields[1]), sum(int(f) for f in fields[11:15]))


def _pids() -> list[int]:
    return [int(p.name) for p in _PROC.iterdir() if p.name.isdigit()]


def _table() -> dict[int, _Proc]:
    return {pid: proc for pid in _pids() if (proc := _read_proc(pid)) is not None}


def _tree(root: int, table: dict[int, _Proc]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def tree_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and every process under it (see the module docstring)."""
    if not _PROC.is_dir():
        return None
    table = _table()
    return sum(table[pid].ticks for pid in _tree(root, table)) / _TICK


def matching_seconds(needle: str, *, outside: int | None = None) -> float | None:
    """CPU seconds of every process whose command line contains ``needle``.

    ``outside``: leave out that process and every process under it (the loader's
    own processes may name the server's directory in their arguments).
    """
    if not _PROC.is_dir():
        return None
    table = _table()
    skip = set() if outside is None else _tree(outside, table)
    wanted = needle.encode()
    total = 0
    for pid, proc in table.items():
        if pid in skip:
            continue
        try:
            cmdline = (_PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if wanted in cmdline:
            total += proc.ticks
    return total / _TICK


def machine_busy_seconds() -> float | None:
    """Non-idle CPU seconds of all CPUs since boot (``/proc/stat``), None off Linux."""
    try:
        first = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal guest guest_nice: guests are
    # already counted in user and nice, idle and iowait are not busy.
    ticks = [int(x) for x in first[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


@dataclass(frozen=True)
class CpuMark:
    """The three sums at one moment (None where not measurable)."""

    loader: float | None
    server: float | None
    machine: float | None


def mark(server_dir: str | None) -> CpuMark:
    """The sums now: this process's tree, the server under ``server_dir``, the machine."""
    return CpuMark(
        tree_seconds(os.getpid()),
        None if server_dir is None else matching_seconds(server_dir, outside=os.getpid()),
        machine_busy_seconds(),
    )


def spent(before: CpuMark, after: CpuMark) -> CpuMark:
    """What each sum grew by between two marks (None where either is None)."""

    def delta(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, b - a)

    return CpuMark(
        delta(before.loader, after.loader),
        delta(before.server, after.server),
        delta(before.machine, after.machine),
    )
