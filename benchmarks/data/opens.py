"""Counting the files a loader opens: ``perf stat`` on the open syscalls' tracepoints.

``perf stat -p <this process>`` counts ``syscalls:sys_enter_open``, ``openat`` and
``openat2`` in this process and every thread and process it starts afterwards
(DataLoader workers, forked or spawned, inherit the counters), and in
multiprocessing's fork server if one runs (its workers are its children), twice: all calls,
and those whose path starts with the benchmark directory (a tracepoint filter on
the path string: ``filename.ustring ~ "<dir>/*"``), i.e. the dataset's files and
the loaders' caches. It is started disabled and switched on and off around an
epoch through its control FIFO (``--delay=-1 --control``), so imports and setup
before the epoch are not counted.

Why not ``strace -f -c``: it stops the traced process on every counted call. Reading
10,000 warm 100 KB files took 0.19-0.21 s untraced and 0.45-1.90 s under
``strace -f --seccomp-bpf -e trace=open,openat,openat2`` on the 2-core machine the
report was made on, so the baseline would have been measured 2-9x slower than it
is; the kernel's counters cost nothing measurable. Opens relative to a directory
descriptor (``openat(dirfd, "name")``) are counted in "all" but not matched by the
path filter; none of the readers here opens that way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

EVENTS = ("syscalls:sys_enter_open", "syscalls:sys_enter_openat", "syscalls:sys_enter_openat2")
_WAIT = 30.0


def _filter(prefix: Path) -> str:
    return f'filename.ustring ~ "{prefix}/*"'


def _followed() -> str:
    """This process, and multiprocessing's fork server if one runs already.

    A fork server started in an earlier epoch is not this process's descendant
    from perf's point of view any more (perf attaches per epoch and follows only
    what is created after it attached): its workers would go uncounted unless it
    is followed too. One started during the epoch is followed by inheritance.
    """
    import multiprocessing.forkserver  # noqa: PLC0415

    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    return str(os.getpid()) if server is None else f"{os.getpid()},{server}"


def _argv(prefix: Path, pid: int | str | None, out: Path, control: str | None) -> list[str]:
    argv = ["perf", "stat", "-x,", "-o", str(out)]
    if control is not None:
        argv += ["--delay=-1", "--control", control]
    for event in EVENTS:
        argv += ["-e", event]
    for event in EVENTS:
        argv += ["-e", event, "--filter", _filter(prefix)]
    return [*argv, "-p", str(pid)] if pid is not None else argv


def _parse(out: Path) -> tuple[int, int]:
    counts = []
    for line in out.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        value = line.split(",", 1)[0]
        counts.append(int(value) if value.isdigit() else 0)  # "<not counted>" reads as 0
    if len(counts) != 2 * len(EVENTS):
        raise RuntimeError(f"perf printed {len(counts)} counts, expected {2 * len(EVENTS)}")
    n = len(EVENTS)
    return sum(counts[:n]), sum(counts[n:])


def problem(prefix: Path) -> str | None:
    """Why opens cannot be counted here (``None``: they can), checked with a real count."""
    if shutil.which("perf") is None:
        return "`perf` is not installed (Debian: linux-perf)"
    prefix.mkdir(parents=True, exist_ok=True)
    probe = prefix / "probe"
    probe.write_bytes(b"")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.csv"
        argv = _argv(prefix, None, out, None)
        try:
            done = subprocess.run(
                [*argv, "--", "cat", str(probe)],
                capture_output=True,
                text=True,
                timeout=_WAIT,
                check=False,
            )
            if done.returncode != 0:
                return f"`perf stat` on the open tracepoints failed: {done.stderr.strip()[-300:]}"
            _, data = _parse(out)
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as exc:
            return f"`perf stat` failed: {exc}"
    probe.unlink()
    if data != 1:
        return f"`perf stat`'s path filter counted {data} opens of one file, not 1"
    return None


class OpenCounter:
    """``with OpenCounter(prefix) as c: ...``; then ``c.all`` and ``c.data`` hold the counts."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.all: int | None = None
        self.data: int | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="mg-opens-"))
        self._perf: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OpenCounter:
        ctl, ack = self._tmp / "ctl", self._tmp / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        argv = _argv(self.prefix, _followed(), self._tmp / "out.csv", f"fifo:{ctl},{ack}")
        self._perf = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Opening the FIFOs waits for perf to open its ends; the ack says it is counting.
        self._ctl = open(ctl, "w")  # kept open across the block
        self._ack = open(ack)
        self._command("enable")
        return self

    def _command(self, what: str) -> None:
        self._ctl.write(f"{what}\n")
        self._ctl.flush()
        # perf writes "ack\n" with its C string's NUL: it starts the next line.
        if self._ack.readline().strip("\0\n ") != "ack":
            raise RuntimeError(f"perf did not acknowledge {what!r}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._perf is not None
        try:
            self._command("disable")
        finally:
            self._ctl.close()
            self._ack.close()
            self._perf.send_signal(signal.SIGINT)
            try:
                self._perf.wait(timeout=_WAIT)
            except subprocess.TimeoutExpired:
                self._perf.kill()
                self._perf.wait()
        if exc_type is None:
            self.all, self.data = _parse(self._tmp / "out.csv")
        with contextlib.suppress(OSError):
            shutil.rmtree(self._tmp)
