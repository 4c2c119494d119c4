"""The dataset benchmark's CPU sums: a process tree, a server's processes, the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from benchmarks.data import cpu
from benchmarks.data.config import Epoch
from benchmarks.data.report import THROUGHPUT_COLUMNS, _cpu

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")

#: Spins for the given seconds of wall time, then exits (a busy CPU for that long).
SPIN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end: pass\n"
)

#: Spins until it has used the given seconds of CPU, then exits (on a loaded machine,
#: wall time says little about how much CPU a spinning child gets).
SPIN_CPU = "import sys, time\nend = float(sys.argv[1])\nwhile time.process_time() < end: pass\n"


def _own_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` alone, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _until_busy(*pids: int, seconds: float = 0.3) -> None:
    """Wait until each process has used ``seconds`` of CPU (on a loaded machine, wall
    time says little about how much CPU a spinning child got)."""
    deadline = time.monotonic() + 60
    while any(_own_seconds(pid) < seconds for pid in pids):
        assert time.monotonic() < deadline, "the spinning children got no CPU in 60 s"
        time.sleep(0.05)


def test_a_child_that_ran_and_was_reaped_during_the_interval_is_counted() -> None:
    before = cpu.mark(None)
    subprocess.run([sys.executable, "-c", SPIN_CPU, "0.6"], check=True, timeout=120)
    used = cpu.spent(before, cpu.mark(None))
    assert used.loader is not None
    # Its CPU moved into this process's reaped-children fields: counted once, not lost.
    assert 0.5 <= used.loader <= 3.0  # 0.6 s by its own clock; /proc counts 10 ms ticks
    assert used.server is None


def test_a_child_still_running_at_the_end_is_counted_by_its_own_time() -> None:
    before = cpu.mark(None)
    child = subprocess.Popen([sys.executable, "-c", SPIN, "30"])
    try:
        _until_busy(child.pid)
        spun = _own_seconds(child.pid)
        used = cpu.spent(before, cpu.mark(None))
    finally:
        child.kill()
        child.wait()
    assert used.loader is not None
    assert used.loader >= spun - 1e-6  # all of the child's CPU so far (sums of ticks)


def test_only_processes_naming_the_needle_count_as_the_server() -> None:
    needle = f"/srv-{uuid.uuid4().hex}"
    start = cpu.matching_seconds(needle)
    assert start == 0.0  # nothing names it yet
    named = subprocess.Popen([sys.executable, "-c", SPIN, "30", needle])
    other = subprocess.Popen([sys.executable, "-c", SPIN, "30"])
    try:
        _until_busy(named.pid, other.pid)
        low = _own_seconds(named.pid)
        server = cpu.matching_seconds(needle)
        high, others = _own_seconds(named.pid), _own_seconds(other.pid)
    finally:
        for proc in (named, other):
            proc.kill()
            proc.wait()
    assert server is not None
    # Exactly the named process's own CPU, read just before and after; the other
    # spinning child (at least 0.3 s of CPU by then) is not in it.
    assert low <= server <= high
    assert high - low < others
    # This process's tree is left out when asked: here, all of the busy named process.
    mine = subprocess.Popen([sys.executable, "-c", SPIN, "30", needle])
    try:
        time.sleep(0.5)
        assert cpu.matching_seconds(needle, outside=os.getpid()) == 0.0
        assert (cpu.matching_seconds(needle) or 0.0) > 0.0
    finally:
        mine.kill()
        mine.wait()


def test_a_command_name_with_spaces_and_parentheses_is_parsed() -> None:
    script = (
        "import time\n"
        "open('/proc/self/comm', 'w').write('a) b (c')\n"
        "end = time.monotonic() + 30\n"
        "while time.monotonic() < end: pass\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        time.sleep(0.8)
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b (c"
        proc = cpu._read_proc(child.pid)
    finally:
        child.kill()
        child.wait()
    assert proc is not None
    assert proc.ppid == os.getpid()
    assert proc.ticks > 0


def test_the_machine_busy_sum_grows_while_a_cpu_is_busy() -> None:
    before = cpu.machine_busy_seconds()
    subprocess.run([sys.executable, "-c", SPIN, "0.6"], check=True)
    after = cpu.machine_busy_seconds()
    assert before is not None and after is not None
    assert after - before >= 0.3


def _epoch(**cpu_fields: float | int | None) -> Epoch:
    return Epoch("cold", 2.0, 10, 10, 1000, 1.0, 1.0, **cpu_fields)  # type: ignore[arg-type]


def test_the_report_cell_gives_loader_server_and_busy_share() -> None:
    epoch = _epoch(cpu_loader_s=1.234, cpu_server_s=0.5, cpu_machine_s=3.0, cpus=2)
    assert _cpu(epoch) == "1.23 / 0.50 / 75% of 2"  # 3 CPU-s of 2 s x 2 CPUs
    assert _cpu(_epoch(cpu_loader_s=1.0, cpu_machine_s=1.0, cpus=2)) == "1.00 / - / 25% of 2"
    assert _cpu(_epoch()) == "-"  # not measured (not Linux, or an older result)
    assert THROUGHPUT_COLUMNS[-1].startswith("CPU s")
