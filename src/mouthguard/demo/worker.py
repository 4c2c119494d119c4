"""The demo's training process: ``python -m mouthguard.demo.worker ...``.

One invocation trains the demo job (see :mod:`mouthguard.demo.training`) to
``--steps``, checkpointing every ``--every`` steps, and reports what it does as
JSON lines on stdout, one object per line, flushed at once so a parent can act
on them while the process runs::

    {"event": "start", "pid": 4242, "step": 0, "params": 2430016, ...}
    {"event": "resumed", "step": 30, "tier": "durable", "rejected": [{"step": 40, ...}], ...}
    {"event": "step", "step": 31, "loss": 0.0123}
    {"event": "saving", "step": 50, "importance": "routine", "throttled": true, "stall": 0.004,
     "memcpy": 0.003, ...}
    {"event": "saved", "step": 50, "importance": "routine", "seconds": 0.09, "stall": 0.004,
     "memcpy": 0.003, "bytes": 29144800, "set_aside": []}
    {"event": "replicated", "step": 50, "seconds": 0.12}
    {"event": "done", "step": 100, "loss_hex": "0x1.9p-7", "weights_sha256": "...", ...}
    {"event": "error", "message": "..."}      # then exit status 1

Modes: a fresh run (default), ``--resume`` (load the newest valid checkpoint of
the run, reporting every copy ``load()`` rejected on the way), and
``--no-checkpoints`` (the reference: same training, never saved, never
interrupted). ``--throttle-step`` makes the save of that step go through a
:class:`~mouthguard.tiers.throttle.ThrottledTier` lasting about
``--throttle-seconds``, so that a parent can kill the process in the middle of it.

Saves are asynchronous (``save_async``): training goes on while a save is
written; the next save, or the end of the run, waits for it to commit first.
Each save reports its stall beside a plain memcpy of the same state
(:class:`~mouthguard.demo.training.MemcpyClock`).

Replication: on a store with several tiers the checkpointer replicates in a
background thread. ``--wait-replicated`` waits after every (unthrottled) save
until the checkpoint is replicated, so that a kill finds every committed step
on every tier; every run that finishes waits for replication before ``done``.
A resumed run saves without replication until it has saved again every step
``load()`` rejected, then hands the damage ``load()`` found to replication:
so the save onto a damaged step sets that step's damaged fast copy aside
itself, and no background repair ever races ``load()`` or that save for the
same copy (the demo's story is then the same on every machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.async_save import SaveHandle
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import LoadedCheckpoint
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.demo.process import DemoError, WorkerProcess  # re-exported: the protocol's two ends
from mouthguard.demo.training import (
    Job,
    MemcpyClock,
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
from mouthguard.jobs.service import service_for
from mouthguard.policy.importance import Importance
from mouthguard.tiers.throttle import ThrottledTier

__all__ = ["DemoError", "WorkerProcess", "build_parser", "emit", "main", "run"]


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
    parser.add_argument(
        "--wait-replicated",
        action="store_true",
        help="after every unthrottled save, wait until it is replicated",
    )
    parser.add_argument(
        "--replication-timeout", type=float, default=60.0, help="bound on each such wait"
    )
    return parser


def state_bytes(state: object) -> int:
    """Bytes of tensor data in ``state`` (what a save will mostly write)."""
    return sum(t.numel() * t.element_size() for _, t in iter_tensors(state))


def _resume(job: Job, checkpointer: Checkpointer) -> LoadedCheckpoint:
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
        tier=loaded.tier,
        seconds=time.perf_counter() - started,
        loss=saved_loss if isinstance(saved_loss, float) else None,
        rejected=[{"step": r.step, "tier": r.tier, "reason": r.reason} for r in loaded.rejected],
        warnings=[str(w.message) for w in fallback],
    )
    return loaded


def _throttled(store: Store, run: str, rate: float) -> Checkpointer:
    """A checkpointer whose fast tier writes at ``rate``; it never replicates (it gets killed)."""
    tiers = [ThrottledTier(store.fast, rate), *store.tiers[1:]]
    throttled = Store(tiers, source=store.source, policy=store.policy)
    return Checkpointer(throttled, run, background=False)


def _set_aside(store: Store, run: str, step: int) -> set[str]:
    """Names of the damaged copies of ``step`` set aside on the fast tier so far."""
    prefix = f"{catalog.step_dir(step)}.rejected-"
    return {d for d in store.fast.list_dirs(f"{run}/") if d.startswith(prefix)}


class _Checkpointing:
    """The worker's saves: where each goes, and replication around them.

    ``replicating`` replicates in the background (on a store with several
    tiers); ``quiet`` never does: it loads a resumed run and saves up to the
    newest step that load rejected (see the module docstring), after which the
    rejected copies are handed to replication.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        store = open_store(args.store)
        self.replicating = Checkpointer(store, args.run)
        self.quiet = Checkpointer(store, args.run, background=False)
        self.rejected: list[int] = []  # steps load() rejected, still to hand to replication
        self.pending: _Pending | None = None
        self._memcpy = MemcpyClock()

    def resume(self, job: Job) -> None:
        """Load the newest valid checkpoint into ``job`` (quietly: no repair races the load)."""
        loaded = _resume(job, self.quiet)
        self.rejected = sorted({r.step for r in loaded.rejected})

    def _start_repairs(self) -> None:
        """Hand the steps ``load()`` rejected to background replication, as ``load()`` would."""
        if self.rejected and self.replicating.background:
            service = service_for(self.replicating.store)
            for step in self.rejected:
                service.request_repair(self.args.run, step)
        self.rejected = []

    def _wait_replicated(self, step: int) -> None:
        started, timeout = time.perf_counter(), self.args.replication_timeout
        if not self.replicating.wait_replicated(timeout):
            raise MouthguardError(f"replication did not finish within {timeout:.0f} s")
        emit("replicated", step=step, seconds=time.perf_counter() - started)

    def save(self, step: int, state: dict[str, object], importance: Importance) -> None:
        """Start an async save of ``state`` as ``step`` (throttled if asked).

        The previous save is settled first (one save in flight, across the
        throttled and the normal checkpointer alike). ``saving`` is reported once
        the snapshot is taken -- with the stall and a memcpy of the same state
        for comparison -- and ``saved`` once the save has committed.
        """
        self.settle()
        target, rate = self.replicating, None
        if self.rejected and step <= self.rejected[-1]:
            target = self.quiet
        else:
            self._start_repairs()
        if step == self.args.throttle_step:
            rate = state_bytes(state) / max(self.args.throttle_seconds, 1e-3)
            target = _throttled(target.store, self.args.run, rate)
        before = _set_aside(target.store, self.args.run, step)
        memcpy = self._memcpy.seconds(state)
        handle = target.save_async(step, state, importance)
        emit(
            "saving",
            step=step,
            importance=importance.value,
            throttled=rate is not None,
            rate=rate,
            stall=handle.stall_seconds,
            memcpy=memcpy,
        )
        self.pending = _Pending(handle, target, before, rate is not None, memcpy, importance)

    def settle(self) -> None:
        """Wait for the save in flight to commit; report ``saved`` (and replication if asked)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        info = pending.handle.result()
        step = pending.handle.step
        emit(
            "saved",
            step=step,
            importance=pending.importance.value,
            seconds=info.save_seconds,
            stall=info.stall_seconds,
            memcpy=pending.memcpy,
            bytes=info.nbytes,
            set_aside=sorted(
                _set_aside(pending.target.store, self.args.run, step) - pending.before
            ),
        )
        if self.args.wait_replicated and not pending.throttled:
            self._wait_replicated(step)

    def finish(self, step: int) -> None:
        """Wait until every checkpoint (and repair) is committed and replicated."""
        self.settle()
        self._start_repairs()  # if no save came after the rejected steps
        self._wait_replicated(step)


@dataclass(frozen=True)
class _Pending:
    """An async save in flight and what its ``saved`` report needs."""

    handle: SaveHandle
    target: Checkpointer
    before: set[str]
    throttled: bool
    memcpy: float
    importance: Importance


def run(args: argparse.Namespace) -> None:
    """Train (and checkpoint, unless ``--no-checkpoints``) as the arguments say.

    Raises:
        ValueError: the arguments are inconsistent.
        MouthguardError: a save, the resume's load or replication failed.
    """
    if args.every < 1 or args.steps < 0:
        raise ValueError(f"need --every >= 1 and --steps >= 0, got {args.every} and {args.steps}")
    config = TrainConfig(
        seed=args.seed, hidden=args.hidden, depth=args.depth, total_steps=args.steps
    )
    job = build_job(config)
    emit("start", pid=os.getpid(), step=0, params=parameter_count(job), total_steps=args.steps)
    saves = None if args.no_checkpoints else _Checkpointing(args)
    if saves is not None and args.resume:
        saves.resume(job)
    loss = job.state.metadata.get("loss")
    while job.state.step < config.total_steps:
        loss = train_step(job)
        step = job.state.step
        emit("step", step=step, loss=loss)
        if saves is not None and step % args.every == 0:
            importance = importance_for(
                step, total_steps=args.steps, milestone_every=args.milestone_every
            )
            saves.save(step, job.state.state_dict(), importance)
    if saves is not None:
        saves.finish(job.state.step)
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


if __name__ == "__main__":
    sys.exit(main())
