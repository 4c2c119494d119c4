"""Crash harness: SIGKILL a saving process at random moments, check the store after each kill.

A worker (:mod:`reliability.crash_worker`) saves a deterministic state per step
into an embedded default store (two local tiers), sync and async, routine,
milestone and critical, with background replication, garbage collection and
retention running. The harness kills it with SIGKILL at seeded random moments --
mostly a few milliseconds after it announced a save, so kills land inside the
write, the commit and the copies that follow -- then checks the store from a
fresh ``Store`` in this process, and starts a new worker that resumes from the
newest valid checkpoint.

Invariants checked after every kill (a case survives when all hold):

(a) *Byte-exact.* Every step ``Checkpointer.list()`` shows is loaded with
    ``load(step)`` through each tier alone (a ``Store`` of that one tier), so
    every copy the whole store's ``load(step)`` could pick is read, and must
    equal ``state_for(step)`` byte for byte (a step the store lists but no tier
    does fails the case).
    A load that returns other bytes counts in ``accepted_corrupt``. A committed
    copy that is *rejected* (a fallback warning, ``CorruptCheckpointError``)
    fails the case: a killed process must not damage committed data.
(b) *No acknowledged save lost.* Every step the worker acknowledged (its
    ``acked`` line: ``save`` or ``handle.result()`` returned) is still listed,
    except a *routine* step that retention may have dropped: one for which some
    retention pass began after it was committed while at least ``keep_last``
    (3) newer routine steps were committed (acknowledged, seen committed by a
    check, or the save in flight when the pass began and committed). That is
    the only way the policy drops a routine step here (no best-K, no
    keep-within, trash delay 0); milestone (keep-all by default) and critical
    (never auto-deleted) steps must always be there. Anything else missing
    counts in ``lost_acknowledged``. Conversely every listed step was announced
    by the worker, and a listed step never acknowledged must have been the save
    in flight at a kill.
(c) *Newest.* ``load()`` returns the newest listed step, byte-exact.
(d) *Leftovers.* Partial directories, temporary files and step directories
    without a manifest on either tier survive ``collect_garbage(grace_seconds=3600)``
    untouched (never collected before the grace); on every other kill (and at
    the end) they are left to age past a short grace and
    ``collect_garbage(grace_seconds=GRACE)`` must remove every one of them while
    the committed steps stay exactly as they were.
(e) *Nothing outside.* The store lives in a directory next to the worker's
    working and temporary directories; any file created, changed or removed
    there outside the store root counts in ``writes_outside``.

Housekeeping errors in the worker (``collect_garbage`` or retention raising) do
not break an invariant above: they are counted in ``details["job_errors"]``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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
from reliability.record import HarnessResult, Level

ROOT = Path(__file__).resolve().parents[1]
#: The short grace of check (d): leftovers older than this must be collected.
GRACE = 0.3
TIERS = ("fast", "durable")
ROUTINE_KEEP_LAST = PolicyConfig().level(Importance.ROUTINE).keep_last or 0


@dataclass(frozen=True)
class Params:
    """How much one level tries."""

    kills: int
    seed: int
    # More kills, only while none has landed inside a save's write yet: on a loaded
    # machine (the suite under pytest -n 4) saves stretch and 4 were sometimes not enough.
    extra_kills: int = 24
    full_check_every: int = 1  # full (a) on every n-th kill; otherwise new + sampled steps


LEVELS: dict[str, Params] = {
    "ci": Params(kills=8, seed=20240611),
    "soak": Params(kills=400, seed=7, full_check_every=25),
}


# --- the worker ----------------------------------------------------------------


class Worker:
    """One worker process, started early and told to go once the store is quiet."""

    def __init__(self, store: Path, area: Path, logs: Path, seed: int) -> None:
        path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        env["TMPDIR"] = str(area / "tmp")
        self.log = logs / f"worker-{seed}.stderr"
        argv = [sys.executable, "-m", "reliability.crash_worker", str(store), "--wait-go"]
        with self.log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [*argv, "--seed", str(seed)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=area / "cwd",
                env=env,
            )
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue  # a line cut short by the kill acknowledges nothing
            if isinstance(event, dict):
                self.events.append((time.monotonic(), event))
                self.queue.put(event)
        self.queue.put(None)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def wait_for(self, match: Any, nth: int, timeout: float) -> str:
        """Wait for the ``nth`` event ``match`` accepts: ``hit``, ``exited`` or ``timeout``."""
        deadline = time.monotonic() + timeout
        seen = 0
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.queue.get(timeout=left)
            except queue.Empty:
                break
            if event is None:
                return "exited"
            if match(event):
                seen += 1
                if seen >= nth:
                    return "hit"
        return "timeout"

    def kill(self) -> None:
        """SIGKILL, then read everything it printed before it died."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def dismiss(self) -> None:
        """End a worker that was never told to go (its stdin closes: it exits)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


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
                if step not in on_tier:
                    continue
                try:
                    _, exact = _load_checked(alone, step)
                except MouthguardError as exc:
                    failures.append(f"(a) step {step} on {tier.name} rejected: {exc}")
                    continue
                if not exact:
                    ledger.corrupt.add((tier.name, step))
                    failures.append(f"(a) step {step} on {tier.name} loaded with wrong bytes")
        ledger.checked.update(to_check)
        # Every copy was read above; through the whole store only what no tier listed
        # alone (there should be nothing) and, for (c), the newest.
        for step in sorted(set(to_check) - on_some_tier):
            failures.append(f"(a) step {step} listed by the store but by no tier alone")
            try:
                _, exact = _load_checked(ckpt, step)
            except MouthguardError as exc:
                failures.append(f"(a) step {step} rejected: {exc}")
                continue
            if not exact:
                ledger.corrupt.add(("store", step))
                failures.append(f"(a) step {step} loaded with wrong bytes")
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


# --- one kill ----------------------------------------------------------------------


def _plan(rng: random.Random, window: float) -> tuple[str, Any, int, float]:
    """Where to aim the next kill: (name, event matcher, nth event, delay after it)."""
    roll = rng.random()
    if roll < 0.65:
        return ("save", lambda e: e["ev"] == "saving", rng.randint(1, 4), rng.uniform(0, window))
    if roll < 0.8:
        return (
            "after_ack",
            lambda e: e["ev"] == "acked",
            rng.randint(1, 3),
            rng.uniform(0, window),
        )
    if roll < 0.9:
        return (
            "retention",
            lambda e: e["ev"] == "retention" and e["phase"] == "begin",
            1,
            rng.uniform(0, 0.03),
        )
    return ("anytime", lambda e: e["ev"] == "ready", 1, rng.uniform(0.05, 1.5))


def _landed(events: list[dict[str, Any]], fresh: set[str], listed: list[int]) -> list[str]:
    """Where the kill landed, from the worker's last events and the debris it left."""
    saving = {e["step"] for e in events if e["ev"] == "saving"}
    acked = {e["step"] for e in events if e["ev"] == "acked"}
    where = []
    in_flight = sorted(saving - acked)
    if in_flight:
        step = in_flight[-1]
        on_fast = any(p.startswith(f"fast/{RUN}/{step:012d}.partial-") for p in fresh)
        if on_fast:
            where.append("inside_save_write")
        elif step in listed:
            where.append("save_committed_not_acked")
        else:
            where.append("save_not_yet_writing")
    if any(p.startswith("durable/") for p in fresh):
        where.append("inside_copy")
    for job in ("retention", "gc"):
        phases = [e["phase"] for e in events if e["ev"] == job]
        if phases and phases[-1] == "begin":
            where.append(f"inside_{job}")
    return where or ["between"]


def _save_window(durations: list[float]) -> float:
    """Kill within this long after a "saving" line: about one save's duration."""
    if not durations:
        return 0.05
    return min(0.5, max(0.005, 1.5 * statistics.median(durations[-50:])))


def run(level: Level = "ci", *, kills: int | None = None, seed: int | None = None) -> HarnessResult:
    """Run the crash harness at ``level`` (``kills``/``seed`` override the level's)."""
    params = LEVELS[level]
    kills = params.kills if kills is None else kills
    seed = params.seed if seed is None else seed
    command = f".venv/bin/python -m reliability.run --level {level} --only crash"
    if (kills, seed) != (params.kills, params.seed):
        command = (
            f".venv/bin/python -m reliability.crash --level {level} --kills {kills} --seed {seed}"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mouthguard-crash-") as tmp:
        return _run(Path(tmp), level, kills, seed, params, command, started)


def _run(
    base: Path, level: Level, kills: int, seed: int, params: Params, command: str, started: float
) -> HarnessResult:
    rng = random.Random(seed)
    area, logs = base / "area", base / "logs"
    store_dir = area / "store"
    for d in (area / "cwd", area / "tmp", logs):
        d.mkdir(parents=True)
    mouthguard.open_store(store_dir)  # the two tier roots exist before the first snapshot
    outside_before = outside_snapshot(area, store_dir)
    ledger = Ledger()
    landed: Counter[str] = Counter()
    aims: Counter[str] = Counter()
    job_errors: Counter[str] = Counter()
    messages: list[str] = []
    durations: list[float] = []
    # where the time goes, summed over kills
    phases = dict.fromkeys(("resume", "run_until_kill", "check"), 0.0)
    cases = survived = seen_leftovers = collected = 0
    worker = Worker(store_dir, area, logs, rng.randrange(2**31))
    limit = kills + params.extra_kills
    nxt: Worker | None = None
    try:
        while cases < kills or (cases < limit and not landed["inside_save_write"]):
            failures: list[str] = []
            before = set(leftovers(store_dir))
            worker.go()
            # The next worker imports (torch: a second) while this one runs and we check;
            # it touches nothing before its go.
            nxt = Worker(store_dir, area, logs, rng.randrange(2**31))
            aim, match, nth, delay = _plan(rng, _save_window(durations))
            aims[aim] += 1
            t0 = time.monotonic()
            outcome = worker.wait_for(lambda e: e["ev"] == "ready", 1, 120)
            phases["resume"] += time.monotonic() - t0
            if outcome == "timeout":
                failures.append("worker not ready within 120 s")
            elif outcome == "hit":
                outcome = worker.wait_for(match, nth, 15) if aim != "anytime" else "hit"
                time.sleep(delay)
            worker.kill()
            t1 = time.monotonic()
            phases["run_until_kill"] += t1 - t0
            timed = list(worker.events)
            events = [e for _, e in timed]
            if outcome == "exited" or any(e["ev"] == "error" for e in events):
                errors = [e["message"] for e in events if e["ev"] == "error"]
                failures.append(f"worker died by itself: {errors} {worker.stderr_tail()}")
            worker = nxt
            _learn(ledger, timed, durations, job_errors, messages)
            try:
                full = (cases + 1) % params.full_check_every == 0
                listed = check_store(store_dir, ledger, rng, full=full, failures=failures)
                fresh = set(leftovers(store_dir)) - before
                for where in _landed(events, fresh, listed):
                    landed[where] += 1
                seen, gone = check_leftovers(
                    store_dir, listed, collect=cases % 2 == 1, failures=failures
                )
            except Exception as exc:  # the store broke the checker: that is a failed case
                failures.append(f"checking raised {type(exc).__name__}: {exc}")
                listed, seen, gone = ledger.last_listed, 0, 0
            seen_leftovers, collected = seen_leftovers + seen, collected + gone
            phases["check"] += time.monotonic() - t1
            changed = _outside_changes(outside_before, outside_snapshot(area, store_dir))
            if changed - ledger.outside:
                failures.append(
                    f"(e) written outside the store: {sorted(changed - ledger.outside)}"
                )
                ledger.outside |= changed
            ledger.last_listed = listed
            cases += 1
            survived += not failures
            messages.extend(f"kill {cases}: {f}" for f in failures)
    finally:
        worker.dismiss()
        if nxt is not None and nxt is not worker:
            nxt.dismiss()
    final: list[str] = []
    listed = check_store(store_dir, ledger, rng, full=True, failures=final)
    check_leftovers(store_dir, listed, collect=True, failures=final)
    messages.extend(f"final check: {f}" for f in final)
    return HarnessResult(
        harness="crash",
        what=(
            "SIGKILL of a process saving (sync and async; routine, milestone, critical) "
            "with background replication, retention and gc running, at seeded random "
            "moments, mostly within one save's duration after a save began; a fresh "
            "store checked after each kill, then resumed"
        ),
        cases=cases,
        survived=survived if not final else min(survived, cases - 1),
        accepted_corrupt=len({step for _, step in ledger.corrupt}),
        lost_acknowledged=len(ledger.lost),
        writes_outside=len(ledger.outside),
        cases_by_kind={f"aimed at {aim}": n for aim, n in sorted(aims.items())},
        acknowledged=len(ledger.acked),
        excluded={"deleted by retention, as the policy asks": len(ledger.dropped_by_retention)},
        command=command,
        seconds=round(time.monotonic() - started, 1),
        details={
            "level": level,
            "seed": seed,
            "kills_aimed_at": dict(aims),
            "kills_landed": dict(landed),
            "saves_announced": len(ledger.announced),
            "saves_acknowledged": len(ledger.acked),
            "acknowledged_dropped_by_retention": len(ledger.dropped_by_retention),
            "retention_passes": len(ledger.passes),
            "steps_at_end": len(listed),
            "leftovers_seen": seen_leftovers,
            "leftovers_collected_after_grace": collected,
            "job_errors": dict(job_errors),
            "save_window_seconds": round(_save_window(durations), 4),
            "seconds_in": {k: round(v, 1) for k, v in phases.items()},
            "failures": messages[:30],
        },
    )


def _learn(
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


def _outside_changes(
    before: dict[str, tuple[bool, int, int]], after: dict[str, tuple[bool, int, int]]
) -> set[str]:
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    # Directories' mtimes move when their entries do; the entries themselves are reported.
    return {p for p in changed if not (before.get(p, (False,))[0] and after.get(p, (False,))[0])}


def main(argv: list[str] | None = None) -> int:
    """``python -m reliability.crash``: run the harness alone, print its JSON."""
    parser = argparse.ArgumentParser(prog="python -m reliability.crash")
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--kills", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    result = run(args.level, kills=args.kills, seed=args.seed)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
