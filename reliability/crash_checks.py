"""The crash harness's checker: what it knows across kills, and the invariants it judges.

:mod:`reliability.crash` kills a saving worker again and again; after each kill
this module checks the store (invariants (a) to (e) of that module's docstring)
from a fresh ``Store`` and folds the worker's event lines into the
:class:`Ledger`, the harness's memory of what was announced, acknowledged,
committed and in flight.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mouthguard
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError
from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.importance import Importance
from reliability.crash_worker import RUN, importance_for, same_state, state_for

#: Leftovers must be collected once older than this (seconds), invariant (d).
GRACE = 0.3
TIERS = ("fast", "durable")
ROUTINE_KEEP_LAST = PolicyConfig().level(Importance.ROUTINE).keep_last or 0


# --- the file system around the store -------------------------------------------


def leftovers(store: Path) -> dict[str, float]:
    """Debris of interrupted writes on both tiers: relative path -> newest mtime inside."""
    found: dict[str, float] = {}
    for tier in TIERS:
        run_dir = store / tier / RUN
        if not run_dir.is_dir():
            continue
        for entry in run_dir.iterdir():
            name = entry.name
            is_partial = ".partial-" in name
            uncommitted = name.isdigit() and not (entry / "manifest.json").exists()
            if entry.is_dir() and (is_partial or uncommitted):
                found[str(entry.relative_to(store))] = _newest_mtime(entry)
            elif entry.is_dir() and ".rejected-" not in name:
                for tmp in entry.rglob(".tmp-*"):  # a sidecar or copy killed mid-put
                    found[str(tmp.relative_to(store))] = tmp.lstat().st_mtime
            elif name.startswith(".tmp-"):
                found[str(entry.relative_to(store))] = entry.lstat().st_mtime
    return found


def _newest_mtime(directory: Path) -> float:
    newest = directory.lstat().st_mtime
    for path in directory.rglob("*"):
        newest = max(newest, path.lstat().st_mtime)
    return newest


def outside_snapshot(area: Path, store: Path) -> dict[str, tuple[bool, int, int]]:
    """Everything under ``area`` but outside ``store``: path -> (is_dir, size, mtime_ns)."""
    snap: dict[str, tuple[bool, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(area):
        here = Path(dirpath)
        if here == store.parent:
            dirnames[:] = [d for d in dirnames if here / d != store]
        for name in [*dirnames, *filenames]:
            path = here / name
            st = path.lstat()
            snap[str(path.relative_to(area))] = (path.is_dir(), st.st_size, st.st_mtime_ns)
    return snap


# --- the checker -----------------------------------------------------------------


@dataclass
class Ledger:
    """What the harness knows about the store across kills."""

    announced: set[int] = field(default_factory=set)  # every step a "saving" line named
    acked: set[int] = field(default_factory=set)
    in_flight_at_kill: set[int] = field(default_factory=set)
    committed: set[int] = field(default_factory=set)  # acked or ever seen listed
    # per retention pass: the routine steps known committed when it began, and the save
    # then in flight (counted once known committed); see (b)
    passes: list[tuple[frozenset[int], int | None]] = field(default_factory=list)
    last_listed: list[int] = field(default_factory=list)
    checked: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    corrupt: set[tuple[str, int]] = field(default_factory=set)  # (tier or 'store', step)
    outside: set[str] = field(default_factory=set)
    dropped_by_retention: set[int] = field(default_factory=set)

    def may_be_dropped(self, step: int) -> bool:
        """Rule (b): whether retention may have dropped acknowledged ``step``."""
        if importance_for(step) != "routine":
            return False
        for routine, in_flight in self.passes:
            committed = set(routine)
            if in_flight is not None and in_flight in self.committed and _routine(in_flight):
                committed.add(in_flight)
            newer = [t for t in committed if t > step]
            if step in committed and len(newer) >= ROUTINE_KEEP_LAST:
                return True
        return False


def _routine(step: int) -> bool:
    return importance_for(step) == "routine"


def _load_checked(ckpt: mouthguard.Checkpointer, step: int | None) -> tuple[int, bool]:
    loaded = ckpt.load(step)
    return loaded.step, same_state(loaded.state, state_for(loaded.step))


def _check_copy(
    ckpt: mouthguard.Checkpointer, step: int, where: str, ledger: Ledger, failures: list[str]
) -> None:
    """Invariant (a) for ``step`` through ``ckpt`` (one tier's name, or ``store``)."""
    on = "" if where == "store" else f" on {where}"
    try:
        _, exact = _load_checked(ckpt, step)
    except MouthguardError as exc:
        failures.append(f"(a) step {step}{on} rejected: {exc}")
        return
    if not exact:
        ledger.corrupt.add((where, step))
        failures.append(f"(a) step {step}{on} loaded with wrong bytes")


def check_store(
    store_dir: Path, ledger: Ledger, rng: random.Random, *, full: bool, failures: list[str]
) -> list[int]:
    """Invariants (a)-(c) on a fresh ``Store``; return the steps listed."""
    store = mouthguard.open_store(store_dir)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        listed = [info.step for info in ckpt.list()]
        if full:
            to_check = listed
        else:  # soak: new steps, the newest few, and a random sample of the rest
            new = [s for s in listed if s not in ledger.checked]
            rest = [s for s in listed if s in ledger.checked]
            sample = rng.sample(rest, min(len(rest), 20))
            to_check = sorted({*new, *listed[-5:], *sample})
        on_some_tier: set[int] = set()
        for tier in store.tiers:
            alone = mouthguard.Checkpointer(
                Store([tier], source=f"{store_dir}:{tier.name}"), run=RUN, background=False
            )
            on_tier = {info.step for info in alone.list()}
            on_some_tier |= on_tier
            for step in to_check:
                if step in on_tier:
                    _check_copy(alone, step, tier.name, ledger, failures)
        ledger.checked.update(to_check)
        # Every copy was read above; through the whole store only what no tier listed
        # alone (there should be nothing) and, for (c), the newest.
        for step in sorted(set(to_check) - on_some_tier):
            failures.append(f"(a) step {step} listed by the store but by no tier alone")
            _check_copy(ckpt, step, "store", ledger, failures)
        if listed:
            try:
                newest, exact = _load_checked(ckpt, None)
            except MouthguardError as exc:
                failures.append(f"(c) load() failed: {exc}")
            else:
                if newest != listed[-1] or not exact:
                    failures.append(
                        f"(c) load() gave step {newest} (exact={exact}), newest {listed[-1]}"
                    )
    failures.extend(f"(a) warning: {warning.message}" for warning in caught)
    # (b) acknowledged saves
    present = set(listed)
    ledger.committed |= present
    for step in sorted(ledger.acked - present):
        if ledger.may_be_dropped(step):
            ledger.dropped_by_retention.add(step)
        elif step not in ledger.lost:
            ledger.lost.add(step)
            failures.append(f"(b) acknowledged {importance_for(step)} step {step} is gone")
    for step in sorted(present - ledger.acked):
        if step not in ledger.announced:
            failures.append(f"(b) step {step} listed but never saved")
        elif step not in ledger.in_flight_at_kill:
            failures.append(f"(b) step {step} listed, not acknowledged, not in flight at a kill")
    return listed


def check_leftovers(
    store_dir: Path, listed: list[int], *, collect: bool, failures: list[str]
) -> tuple[int, int]:
    """Invariant (d); return (leftovers seen, leftovers collected)."""
    before = leftovers(store_dir)
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(store_dir), run=RUN, background=False)
    reports = ckpt.collect_garbage(grace_seconds=3600)
    removed = sum(len(r.partial_saves) + r.incomplete_objects for r in reports)
    after = leftovers(store_dir)
    if removed or set(after) != set(before):
        failures.append(
            f"(d) collected inside the grace: {removed} reported, "
            f"{sorted(set(before) - set(after))} gone"
        )
    if not collect:
        return len(before), 0
    newest = max(after.values(), default=0.0)
    time.sleep(max(0.0, newest + GRACE + 0.05 - time.time()))
    ckpt.collect_garbage(grace_seconds=GRACE)
    remaining = leftovers(store_dir)
    if remaining:
        failures.append(f"(d) left after the grace: {sorted(remaining)}")
    still = [info.step for info in ckpt.list()]
    if still != listed:
        failures.append(f"(d) collection changed the committed steps: {listed} -> {still}")
    return len(before), len(before) - len(remaining)


def learn(
    ledger: Ledger,
    timed: list[tuple[float, dict[str, Any]]],
    durations: list[float],
    job_errors: Counter[str],
    messages: list[str],
) -> None:
    """Fold one worker's events into the ledger (acks, in-flight step, retention passes)."""
    start_committed = set(ledger.last_listed)
    acked_here: set[int] = set()
    began: dict[int, float] = {}
    for when, event in timed:
        kind = event["ev"]
        if kind == "saving":
            ledger.announced.add(event["step"])
            began[event["step"]] = when
        elif kind == "acked":
            step = event["step"]
            ledger.acked.add(step)
            acked_here.add(step)
            if event["mode"] == "sync" and step in began:
                durations.append(when - began[step])
        elif kind == "retention" and event["phase"] == "begin":
            routine = frozenset(s for s in start_committed | acked_here if _routine(s))
            ledger.passes.append((routine, event["in_flight"]))
        elif kind == "job_error":
            job_errors[event["message"].split(":")[0] + f" in {event['job']}"] += 1
            if job_errors.total() <= 3:
                messages.append(f"worker {event['job']} raised: {event['message']}")
    ledger.committed |= acked_here
    unacked = {e["step"] for _, e in timed if e["ev"] == "saving"} - acked_here
    ledger.in_flight_at_kill |= unacked


def outside_changes(
    before: dict[str, tuple[bool, int, int]], after: dict[str, tuple[bool, int, int]]
) -> set[str]:
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    # Directories' mtimes move when their entries do; the entries themselves are reported.
    return {p for p in changed if not (before.get(p, (False,))[0] and after.get(p, (False,))[0])}
