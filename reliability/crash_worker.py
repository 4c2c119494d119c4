"""The process the crash harness kills: saves a deterministic state per step, forever.

Run as ``python -m reliability.crash_worker STORE [options]``. It opens the
embedded default store in ``STORE`` (two local tiers, background replication on),
resumes from the newest valid checkpoint (verifying it byte-exact first), and
then saves steps ``newest+1, newest+2, ...`` -- sync ``save`` or ``save_async``
at random, importance by step number -- with an occasional
``collect_garbage(grace_seconds=...)`` and retention pass in between.

Every event is one JSON line on stdout, flushed before the next action, so the
parent knows what was in flight when it killed us:

``{"ev": "ready", "resumed_from": N|null}``    store open, resume verified
``{"ev": "saving", "step": N, "mode": "sync"|"async", "importance": ...}``
``{"ev": "acked", "step": N, ...}``            ``save`` / ``handle.result()`` returned
``{"ev": "gc", "phase": "begin"|"end", ...}``
``{"ev": "retention", "phase": "begin", "in_flight": N|null}`` and ``"end"`` with counts
``{"ev": "job_error", "job": "gc"|"retention", "message": ...}``  reported, saving goes on
``{"ev": "error", "message": ...}``            then exit 3 (the parent fails the case)

An ``acked`` line is printed only after the save returned: it is the
acknowledgement the harness holds the store to. The state of step ``N`` is
:func:`state_for` ``(N)``, so the parent can check any checkpoint byte-exact.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from typing import Any

import torch

import mouthguard
from mouthguard.jobs.retention import apply_retention
from mouthguard.policy.config import PolicyConfig

#: float32 elements of the big tensor of a routine save (4 MiB: long enough to be hit mid-write).
ROUTINE_ELEMENTS = 1024 * 1024
#: float32 elements of milestone and critical saves (never auto-deleted: kept small).
KEPT_ELEMENTS = 64 * 1024
RUN = "crash"
#: Worker-side grace for its own ``collect_garbage``: far longer than any save or copy here.
WORKER_GRACE_SECONDS = 5.0
#: Hard bound on a worker's life, should the parent never kill it.
MAX_SECONDS = 300.0


def importance_for(step: int) -> str:
    """The importance step ``step`` is saved with (a function of the step, so checkable)."""
    if step % 13 == 12:
        return "critical"
    if step % 5 == 4:
        return "milestone"
    return "routine"


def state_for(step: int, elements: int = ROUTINE_ELEMENTS) -> dict[str, Any]:
    """The deterministic state saved at ``step`` (the checker recomputes it to compare)."""
    importance = importance_for(step)
    n = elements if importance == "routine" else min(elements, KEPT_ELEMENTS)
    return {
        "model": {
            "w": torch.arange(n, dtype=torch.float32) * 0.5 + step,
            "b": torch.full((257,), float(step % 251), dtype=torch.bfloat16),
        },
        "optim": {"count": torch.tensor([step, step * step, -step], dtype=torch.int64)},
        "meta": {
            "step": step,
            "importance": importance,
            "lr": 0.1 / (1 + step),
            "note": f"save {step}",
        },
    }


def emit(**event: Any) -> None:
    """One event line, flushed: it must be on the pipe before the next action starts."""
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def same_state(a: object, b: object) -> bool:
    """Byte-exact equality of two states (dtype, shape and every byte of every tensor)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        raw_a = a.detach().contiguous().reshape(-1).view(torch.uint8)
        raw_b = b.detach().contiguous().reshape(-1).view(torch.uint8)
        return bool(torch.equal(raw_a, raw_b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_state, a, b))
    return type(a) is type(b) and a == b


def _collect_garbage(ckpt: mouthguard.Checkpointer) -> None:
    """One garbage-collection pass, between ``gc`` events; a failure is reported, not fatal."""
    emit(ev="gc", phase="begin")
    try:
        reports = ckpt.collect_garbage(grace_seconds=WORKER_GRACE_SECONDS)
    except Exception as exc:
        emit(ev="job_error", job="gc", message=f"{type(exc).__name__}: {exc}")
    else:
        removed = sum(len(r.partial_saves) + r.incomplete_objects for r in reports)
        emit(ev="gc", phase="end", removed=removed)


def _retain(store: mouthguard.Store, policy: PolicyConfig, *, in_flight: int | None) -> None:
    """One retention pass, between ``retention`` events; a failure is reported, not fatal."""
    emit(ev="retention", phase="begin", in_flight=in_flight)
    try:
        report = apply_retention(store, policy, runs=[RUN])
    except Exception as exc:
        emit(ev="job_error", job="retention", message=f"{type(exc).__name__}: {exc}")
    else:
        done = [a for a in report.actions if a.done]
        emit(
            ev="retention",
            phase="end",
            trashed=sum(a.action.action == "trash" for a in done),
            purged=sorted({a.step for a in done if a.action.action == "purge"}),
            demoted=sum(a.action.action == "demote" for a in done),
        )


def main(argv: list[str] | None = None) -> int:
    """Save until killed (or until ``MAX_SECONDS``); see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m reliability.crash_worker")
    parser.add_argument("store")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--elements", type=int, default=ROUTINE_ELEMENTS)
    parser.add_argument("--wait-go", action="store_true", help="wait for a line on stdin first")
    args = parser.parse_args(argv)
    # --wait-go: started early (everything imported) while the parent still checks the
    # store; nothing touches the store before the go.
    if args.wait_go and sys.stdin.readline().strip() != "go":
        return 0
    rng = random.Random(args.seed)
    store = mouthguard.open_store(args.store)
    ckpt = mouthguard.Checkpointer(store, run=RUN)  # background replication: on (two tiers)
    # Trash delay 0: a dropped routine checkpoint is trashed on one pass, purged on
    # the next, so kills land inside real deletions; every keep rule is the default.
    policy = PolicyConfig(trash_delay_seconds=0.0)
    resumed: int | None = None
    if ckpt.steps():
        loaded = ckpt.load()
        if not same_state(loaded.state, state_for(loaded.step, args.elements)):
            emit(ev="error", message=f"resumed step {loaded.step} is not byte-exact")
            return 3
        resumed = loaded.step
    emit(ev="ready", resumed_from=resumed)
    step = 0 if resumed is None else resumed + 1
    pending: tuple[int, str, Any] | None = None  # (step, importance, handle)
    started = time.monotonic()
    gc_every, retention_every = rng.randint(3, 6), rng.randint(2, 5)
    try:
        while time.monotonic() - started < MAX_SECONDS:
            importance = importance_for(step)
            state = state_for(step, args.elements)
            mode = "async" if rng.random() < 0.5 else "sync"
            if pending is not None:
                done_step, done_importance, handle = pending
                handle.result()
                emit(ev="acked", step=done_step, importance=done_importance, mode="async")
                pending = None
            emit(ev="saving", step=step, mode=mode, importance=importance)
            if mode == "sync":
                ckpt.save(step, state, importance=importance)
                emit(ev="acked", step=step, importance=importance, mode="sync")
            else:
                pending = (step, importance, ckpt.save_async(step, state, importance=importance))
            time.sleep(rng.uniform(0.0, 0.01))  # "training": async writes overlap it
            if step % gc_every == 0:
                _collect_garbage(ckpt)
            if step % retention_every == 0:
                # The save in flight may commit while the pass looks: the checker counts it.
                _retain(store, policy, in_flight=pending[0] if pending is not None else None)
            step += 1
    except BrokenPipeError:
        return 0  # the parent went away
    except Exception as exc:
        traceback.print_exc()
        emit(ev="error", message=f"{type(exc).__name__}: {exc}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
