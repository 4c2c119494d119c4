"""How the benchmark starts its children: a fresh interpreter each, or a fork of a preloaded one.

A real run starts every child as a fresh ``python -m benchmarks.data.child``, so
that one library's imports, threads and caches never meet another's. Each such
child imports torch again, about 2.7 s on a 2-core machine, which is most of a
``--quick`` run's time. With ``--preloaded-children`` (implied by ``--quick``)
the children are instead forked from one *zygote* (:mod:`benchmarks.data.zygote`)
that has imported torch and nothing else: no reader, no mouthguard, no peer,
no thread pool used. What the child then imports and does is its own, as before.

Both launchers give each child its own session (its DataLoader workers are
killed with it as one process group) and bound it by a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol


@dataclass(frozen=True)
class Finished:
    """One child's end: its exit code (None when it was killed on timeout) and output."""

    returncode: int | None
    stdout: str
    stderr: str


#: What every child runs (``python -m CHILD ARGV``).
CHILD = "benchmarks.data.child"


class Launcher(Protocol):
    """Runs ``python -m MODULE ARGV`` (:data:`CHILD` unless told) one child at a time."""

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> Finished:
        """Run one child to its end, or kill it (and its group) after ``timeout`` seconds."""

    def kill(self) -> None:
        """Kill the child running now, if any, with its process group. Idempotent."""

    def close(self) -> None:
        """Kill what runs and release the launcher's own processes. Idempotent."""


class FreshChildren:
    """Every child a fresh interpreter (``subprocess.Popen``)."""

    def __init__(self, cwd: Path, module: str = CHILD) -> None:
        self.cwd, self.module = cwd, module
        self.running: subprocess.Popen[str] | None = None

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> Finished:
        cmd = [sys.executable, "-m", self.module, *argv]
        proc = subprocess.Popen(
            cmd,
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its DataLoader workers too, killed as a group on timeout
        )
        self.running = proc
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            proc.communicate()
            return Finished(None, "", "")
        except BaseException:  # interrupted (SIGTERM, ^C): the child goes too
            self.kill()
            proc.wait()
            raise
        finally:
            self.running = None
        return Finished(proc.returncode, out, err)

    def kill(self) -> None:
        proc = self.running
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()


class ZygoteError(RuntimeError):
    """The zygote stopped answering (it died, or broke the protocol)."""


class PreloadedChildren:
    """Children forked from one zygote that has imported torch (started on first use).

    The zygote answers each request with two lines: the child's pid at once, its
    exit code when it ends. A child's stdout and stderr go to files in a private
    temporary directory, read back when it ends.
    """

    def __init__(self, cwd: Path, env: dict[str, str], module: str = CHILD) -> None:
        self.cwd, self.env, self.module = cwd, env, module
        self.zygote: subprocess.Popen[bytes] | None = None
        self.pending = b""  # bytes read from the zygote past the last full line
        self.pid: int | None = None  # the child running now
        self.scratch = Path(tempfile.mkdtemp(prefix="mouthguard-bench-children-"))

    def _start(self) -> subprocess.Popen[bytes]:
        if self.zygote is None or self.zygote.poll() is not None:
            self.zygote = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.data.zygote"],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            self.pending = b""
        return self.zygote

    def _line(self, zygote: subprocess.Popen[bytes], deadline: float) -> dict[str, int] | None:
        """The zygote's next reply, or None when ``deadline`` (monotonic) passed first."""
        assert zygote.stdout is not None
        fd = zygote.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise ZygoteError(f"the zygote ended (exit {zygote.wait()})")
                self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        reply: dict[str, int] = json.loads(line)
        return reply

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> Finished:
        zygote = self._start()
        self.scratch.mkdir(exist_ok=True)  # again after a close
        out, err = self.scratch / "stdout", self.scratch / "stderr"
        request = {"module": self.module, "argv": argv, "env": env}
        request |= {"stdout": str(out), "stderr": str(err)}
        stdin: IO[bytes] | None = zygote.stdin
        assert stdin is not None
        stdin.write(json.dumps(request).encode() + b"\n")
        stdin.flush()
        started = self._line(zygote, time.monotonic() + 60)
        if started is None:
            self.close()  # out of step with it: the next run starts another
            raise ZygoteError("the zygote did not start a child within 60 s")
        self.pid = started["pid"]
        try:
            ended = self._line(zygote, time.monotonic() + timeout)
            if ended is None:
                self.kill()
                if self._line(zygote, time.monotonic() + 60) is None:  # its exit, after the kill
                    self.close()  # out of step with it: the next run starts another
                return Finished(None, "", "")
        except BaseException:  # interrupted (SIGTERM, ^C): the child goes too
            self.kill()
            raise
        finally:
            self.pid = None
        return Finished(ended["exit"], _read(out), _read(err))

    def kill(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            assert zygote.stdin is not None
            with contextlib.suppress(OSError):
                zygote.stdin.close()  # end of requests: it exits
            try:
                zygote.wait(timeout=10)
            except subprocess.TimeoutExpired:
                zygote.kill()
                zygote.wait()
        with contextlib.suppress(OSError):
            for path in self.scratch.iterdir():
                path.unlink()
            self.scratch.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
