"""The demo's training process: ``python -m mouthguard.demo.worker ...``.

One invocation trains the demo job (see :mod:`mouthguard.demo.training`) to
``--steps``, checkpointing every ``--every`` steps, and reports what it does as
JSON lines on stdout, one object per line, flushed at once so a parent can act
on them while the process runs::

    {"event": "start", "pid": 4242, "step": 0, "params": 2430016, ...}
    {"event": "resumed", "step": 30, "rejected": [{"step": 40, ...}], ...}
    {"event": "step", "step": 31, "loss": 0.0123}
    {"event": "saving", "step": 50, "importance": "routine", "throttled": true, ...}
    {"event": "saved", "step": 50, "importance": "routine", "seconds": 0.09, "bytes": 29144800}
    {"event": "done", "step": 100, "loss_hex": "0x1.9p-7", "weights_sha256": "...", ...}
    {"event": "error", "message": "..."}      # then exit status 1

Modes: a fresh run (default), ``--resume`` (load the newest valid checkpoint of
the run, reporting every checkpoint ``load()`` rejected on the way), and
``--no-checkpoints`` (the reference: same training, never saved, never
interrupted). ``--throttle-step`` makes the save of that step go through a
:class:`~mouthguard.tiers.throttle.ThrottledTier` lasting about
``--throttle-seconds``, so that a parent can kill the process in the middle of it.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.demo.training import (
    Job,
    TrainConfig,
    build_job,
    importance_for,
    optimizer_digest,
    parameter_count,
    train_step,
    weights_digest,
)
from mouthguard.errors import CheckpointFallbackWarning, MouthguardError
from mouthguard.format.state_tree import iter_tensors
from mouthguard.tiers.throttle import ThrottledTier


def emit(event: str, **fields: object) -> None:
    """Write one JSON event line to stdout and flush it (the parent reads it live)."""
    print(json.dumps({"event": event, **fields}), flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The worker's arguments (the scenario is the only intended caller)."""
    parser = argparse.ArgumentParser(prog="python -m mouthguard.demo.worker")
    parser.add_argument("--store", required=True, help="store directory or mouthguard.toml")
    parser.add_argument("--run", required=True, help="run name")
    parser.add_argument("--steps", type=int, default=100, help="train until this step")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--milestone-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=TrainConfig.hidden)
    parser.add_argument("--depth", type=int, default=TrainConfig.depth)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume", action="store_true", help="resume from the newest valid checkpoint"
    )
    mode.add_argument("--no-checkpoints", action="store_true", help="reference run: never save")
    parser.add_argument("--throttle-step", type=int, default=None, help="pace this step's save")
    parser.add_argument("--throttle-seconds", type=float, default=3.0, help="its target duration")
    return parser


def state_bytes(state: object) -> int:
    """Bytes of tensor data in ``state`` (what a save will mostly write)."""
    return sum(t.numel() * t.element_size() for _, t in iter_tensors(state))


def _resume(job: Job, checkpointer: Checkpointer) -> None:
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointFallbackWarning)
        # Fill the fresh model's tensors in place: no second copy of the weights.
        loaded = checkpointer.load(into=job.state.state_dict())
    if not isinstance(loaded.state, Mapping):
        raise MouthguardError(f"checkpoint step {loaded.step} does not hold a training state")
    job.state.load_state_dict(loaded.state)
    fallback = []
    for caught_warning in caught:
        if issubclass(caught_warning.category, CheckpointFallbackWarning):
            fallback.append(caught_warning)
        else:  # not ours to swallow: pass it on to stderr
            text = warnings.formatwarning(
                caught_warning.message,
                caught_warning.category,
                caught_warning.filename,
                caught_warning.lineno,
            )
            sys.stderr.write(text)
    saved_loss = job.state.metadata.get("loss")
    emit(
        "resumed",
        step=loaded.step,
        seconds=time.perf_counter() - started,
        loss=saved_loss if isinstance(saved_loss, float) else None,
        rejected=[{"step": r.step, "tier": r.tier, "reason": r.reason} for r in loaded.rejected],
        warnings=[str(w.message) for w in fallback],
    )


def _throttled(store: Store, run: str, rate: float) -> Checkpointer:
    tiers = [ThrottledTier(store.fast, rate), *store.tiers[1:]]
    return Checkpointer(Store(tiers, source=store.source), run)


def run(args: argparse.Namespace) -> None:
    """Train (and checkpoint, unless ``--no-checkpoints``) as the arguments say.

    Raises:
        ValueError: the arguments are inconsistent.
        MouthguardError: a save or the resume's load failed.
    """
    if args.every < 1 or args.steps < 0:
        raise ValueError(f"need --every >= 1 and --steps >= 0, got {args.every} and {args.steps}")
    config = TrainConfig(
        seed=args.seed, hidden=args.hidden, depth=args.depth, total_steps=args.steps
    )
    job = build_job(config)
    emit("start", pid=os.getpid(), step=0, params=parameter_count(job), total_steps=args.steps)
    checkpointer = None
    if not args.no_checkpoints:
        store = open_store(args.store)
        checkpointer = Checkpointer(store, args.run)
        if args.resume:
            _resume(job, checkpointer)
    loss = job.state.metadata.get("loss")
    while job.state.step < config.total_steps:
        loss = train_step(job)
        step = job.state.step
        emit("step", step=step, loss=loss)
        if checkpointer is None or step % args.every != 0:
            continue
        importance = importance_for(
            step, total_steps=args.steps, milestone_every=args.milestone_every
        )
        state = job.state.state_dict()
        target, rate = checkpointer, None
        if step == args.throttle_step:
            rate = state_bytes(state) / max(args.throttle_seconds, 1e-3)
            target = _throttled(checkpointer.store, args.run, rate)
        emit(
            "saving", step=step, importance=importance.value, throttled=rate is not None, rate=rate
        )
        info = target.save(step, state, importance)
        emit(
            "saved",
            step=step,
            importance=importance.value,
            seconds=info.save_seconds,
            bytes=info.nbytes,
        )
    final = float(loss) if isinstance(loss, float) else math.nan
    emit(
        "done",
        step=job.state.step,
        loss=final,
        loss_hex=final.hex(),
        weights_sha256=weights_digest(job),
        optimizer_sha256=optimizer_digest(job),
        tensors=len(job.model.state_dict()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (1 after an ``error`` event)."""
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (MouthguardError, OSError, ValueError, RuntimeError) as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


# --- the parent's side of the protocol -------------------------------------------


class DemoError(RuntimeError):
    """The demo could not play its scenario: a worker failed or hung, or the disk surprised it."""


Event = dict[str, object]


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


if __name__ == "__main__":
    sys.exit(main())
