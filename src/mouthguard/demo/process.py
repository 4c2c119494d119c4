"""The parent's side of the worker protocol: run ``python -m mouthguard.demo.worker``.

:class:`WorkerProcess` starts a worker (see :mod:`mouthguard.demo.worker` for
its JSON-lines events) and hands its events to the scenario one at a time, with
a deadline on every wait; :class:`DemoError` is what the scenario raises when a
worker fails, hangs, or the disk surprises it; the ``*_record``/``*_state``
functions turn events into the report's typed records.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from mouthguard.checkpoint.info import Rejection
from mouthguard.demo import FinalState, ResumeRecord

__all__ = [
    "DemoError",
    "Event",
    "WorkerProcess",
    "event_field",
    "final_state",
    "resume_record",
]


class DemoError(RuntimeError):
    """The demo could not play its scenario: a worker failed or hung, or the disk surprised it."""


Event = dict[str, object]
T = TypeVar("T")


def event_field(event: Event, key: str, kind: type[T]) -> T:
    """``event[key]`` checked to be a ``kind`` (ints are accepted as floats)."""
    value = event.get(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DemoError(f"malformed worker event {event.get('event')!r}: {key}={value!r}")
    return value


def final_state(event: Event) -> FinalState:
    """The run's end, from a ``done`` event."""
    return FinalState(
        step=event_field(event, "step", int),
        loss=event_field(event, "loss", float),
        loss_hex=event_field(event, "loss_hex", str),
        weights_sha256=event_field(event, "weights_sha256", str),
        optimizer_sha256=event_field(event, "optimizer_sha256", str),
        tensors=event_field(event, "tensors", int),
    )


def resume_record(event: Event) -> ResumeRecord:
    """What the resumed run loaded, from its ``resumed`` event."""
    rejected = event.get("rejected")
    warned = event.get("warnings")
    if not isinstance(rejected, list) or not isinstance(warned, list):
        raise DemoError(f"malformed resumed event: {event!r}")
    loss = event.get("loss")
    return ResumeRecord(
        step=event_field(event, "step", int),
        tier=event_field(event, "tier", str),
        seconds=event_field(event, "seconds", float),
        loss=float(loss) if isinstance(loss, int | float) else None,
        rejections=tuple(
            Rejection(
                event_field(r, "step", int),
                event_field(r, "tier", str),
                event_field(r, "reason", str),
            )
            for r in rejected
            if isinstance(r, dict)
        ),
        warnings=tuple(str(w) for w in warned),
    )


class WorkerProcess:
    """A running worker, read from the parent: its JSON events arrive through a queue.

    Two daemon threads drain stdout (parsed into events) and stderr (last lines
    kept for error messages), so the pipes never fill and every wait can have a
    deadline. Use as a context manager: leaving the block kills the worker if it
    still runs, so no worker outlives a failed scenario.

    Args:
        args: the worker's command-line arguments.
        timeout: seconds any single wait (next event, exit) may take.
    """

    def __init__(self, args: Sequence[str], *, timeout: float) -> None:
        self.timeout = timeout
        self.events_seen: list[Event] = []
        self._events: queue.Queue[Event | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=30)
        self._pending: collections.deque[Event] = collections.deque()
        self._eof = False
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
            [sys.executable, "-m", "mouthguard.demo.worker", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._proc.pid

    def returncode(self) -> int | None:
        """The exit status, or ``None`` while it runs."""
        return self._proc.poll()

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                self._stderr.append(line.rstrip())  # stray output: keep it for diagnostics
                continue
            if isinstance(event, dict) and isinstance(event.get("event"), str):
                self._events.put(event)
        self._events.put(None)

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line.rstrip())

    def _pull(self, timeout: float | None) -> Event | None:
        """Move one event from the reader thread into ``_pending``; None at end or if none yet."""
        try:
            event = self._events.get(timeout=timeout) if timeout else self._events.get_nowait()
        except queue.Empty:
            if timeout:
                raise self.failure(f"worker {self.pid} sent nothing for {timeout:.0f} s") from None
            return None
        if event is None:
            self._eof = True
            return None
        self.events_seen.append(event)
        self._pending.append(event)
        return event

    def next_event(self) -> Event | None:
        """The next event; ``None`` once the worker closed stdout (exited).

        Raises:
            DemoError: no event within ``timeout`` seconds (the worker is hung).
        """
        if not self._pending and not self._eof:
            self._pull(self.timeout)
        return self._pending.popleft() if self._pending else None

    def saw(self, kind: str, step: int) -> bool:
        """Whether the worker has sent an event ``kind`` for ``step`` so far (never blocks).

        Events looked at here are still returned by :meth:`next_event` later.
        """
        for _ in range(10_000):  # bounded: at most what the worker has sent meanwhile
            if self._eof or self._pull(None) is None:
                break
        return any(e["event"] == kind and e.get("step") == step for e in self.events_seen)

    def reap(self) -> int:
        """Wait (bounded) for the worker to exit; kill it if it does not. Returns the status."""
        try:
            return self._proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
            raise self.failure(
                f"worker {self.pid} did not exit within {self.timeout:.0f} s"
            ) from None

    def failure(self, what: str) -> DemoError:
        """A :class:`DemoError` for ``what``, with the exit status and the last stderr lines."""
        tail = "\n".join(self._stderr)
        status = self._proc.poll()
        return DemoError(
            f"{what} (exit status {status})" + (f"; its stderr ends with:\n{tail}" if tail else "")
        )

    def close(self) -> None:
        """Kill the worker if it still runs, then collect it and its reader threads."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=5)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _child_env() -> dict[str, str]:
    """The parent's environment, with this very ``mouthguard`` first on the import path."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the directory holding ``mouthguard/``
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
