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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mouthguard
from reliability.crash_checks import (
    Ledger,
    check_leftovers,
    check_store,
    learn,
    leftovers,
    outside_changes,
    outside_snapshot,
)
from reliability.crash_worker import RUN
from reliability.record import HarnessResult, Level

ROOT = Path(__file__).resolve().parents[1]


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


@dataclass
class _Campaign:
    """What the kills of one run have found so far (the harness's result, in the making)."""

    store_dir: Path
    area: Path
    rng: random.Random
    ledger: Ledger = field(default_factory=Ledger)
    landed: Counter[str] = field(default_factory=Counter)
    aims: Counter[str] = field(default_factory=Counter)
    job_errors: Counter[str] = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    # where the time goes, summed over kills
    phases: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("resume", "run_until_kill", "check"), 0.0)
    )
    cases: int = 0
    survived: int = 0
    seen_leftovers: int = 0
    collected: int = 0
    outside_before: dict[str, tuple[bool, int, int]] = field(default_factory=dict)

    def kill(self, worker: Worker, failures: list[str]) -> list[dict[str, Any]]:
        """Let ``worker`` run to the planned moment, SIGKILL it; return its events."""
        aim, match, nth, delay = _plan(self.rng, _save_window(self.durations))
        self.aims[aim] += 1
        t0 = time.monotonic()
        outcome = worker.wait_for(lambda e: e["ev"] == "ready", 1, 120)
        self.phases["resume"] += time.monotonic() - t0
        if outcome == "timeout":
            failures.append("worker not ready within 120 s")
        elif outcome == "hit":
            outcome = worker.wait_for(match, nth, 15) if aim != "anytime" else "hit"
            time.sleep(delay)
        worker.kill()
        self.phases["run_until_kill"] += time.monotonic() - t0
        timed = list(worker.events)
        events = [e for _, e in timed]
        if outcome == "exited" or any(e["ev"] == "error" for e in events):
            errors = [e["message"] for e in events if e["ev"] == "error"]
            failures.append(f"worker died by itself: {errors} {worker.stderr_tail()}")
        learn(self.ledger, timed, self.durations, self.job_errors, self.messages)
        return events

    def check(
        self, events: list[dict[str, Any]], before: set[str], full: bool, failures: list[str]
    ) -> None:
        """Invariants (a) to (e) after one kill; count the case."""
        t1 = time.monotonic()
        try:
            listed = check_store(
                self.store_dir, self.ledger, self.rng, full=full, failures=failures
            )
            fresh = set(leftovers(self.store_dir)) - before
            for where in _landed(events, fresh, listed):
                self.landed[where] += 1
            seen, gone = check_leftovers(
                self.store_dir, listed, collect=self.cases % 2 == 1, failures=failures
            )
        except Exception as exc:  # the store broke the checker: that is a failed case
            failures.append(f"checking raised {type(exc).__name__}: {exc}")
            listed, seen, gone = self.ledger.last_listed, 0, 0
        self.seen_leftovers += seen
        self.collected += gone
        self.phases["check"] += time.monotonic() - t1
        changed = outside_changes(self.outside_before, outside_snapshot(self.area, self.store_dir))
        if changed - self.ledger.outside:
            failures.append(
                f"(e) written outside the store: {sorted(changed - self.ledger.outside)}"
            )
            self.ledger.outside |= changed
        self.ledger.last_listed = listed
        self.cases += 1
        self.survived += not failures
        self.messages.extend(f"kill {self.cases}: {f}" for f in failures)


def _run(
    base: Path, level: Level, kills: int, seed: int, params: Params, command: str, started: float
) -> HarnessResult:
    rng = random.Random(seed)
    area, logs = base / "area", base / "logs"
    store_dir = area / "store"
    for d in (area / "cwd", area / "tmp", logs):
        d.mkdir(parents=True)
    mouthguard.open_store(store_dir)  # the two tier roots exist before the first snapshot
    campaign = _Campaign(store_dir, area, rng, outside_before=outside_snapshot(area, store_dir))
    worker = Worker(store_dir, area, logs, rng.randrange(2**31))
    limit = kills + params.extra_kills
    nxt: Worker | None = None
    try:
        while campaign.cases < kills or (
            campaign.cases < limit and not campaign.landed["inside_save_write"]
        ):
            failures: list[str] = []
            before = set(leftovers(store_dir))
            worker.go()
            # The next worker imports (torch: a second) while this one runs and we check;
            # it touches nothing before its go.
            nxt = Worker(store_dir, area, logs, rng.randrange(2**31))
            events = campaign.kill(worker, failures)
            worker = nxt
            full = (campaign.cases + 1) % params.full_check_every == 0
            campaign.check(events, before, full, failures)
    finally:
        worker.dismiss()
        if nxt is not None and nxt is not worker:
            nxt.dismiss()
    final: list[str] = []
    listed = check_store(store_dir, campaign.ledger, rng, full=True, failures=final)
    check_leftovers(store_dir, listed, collect=True, failures=final)
    campaign.messages.extend(f"final check: {f}" for f in final)
    return _result(campaign, final, listed, level, seed, command, started)


def _result(
    campaign: _Campaign,
    final: list[str],
    listed: list[int],
    level: Level,
    seed: int,
    command: str,
    started: float,
) -> HarnessResult:
    ledger, cases = campaign.ledger, campaign.cases
    return HarnessResult(
        harness="crash",
        what=(
            "SIGKILL of a process saving (sync and async; routine, milestone, critical) "
            "with background replication, retention and gc running, at seeded random "
            "moments, mostly within one save's duration after a save began; a fresh "
            "store checked after each kill, then resumed"
        ),
        cases=cases,
        survived=campaign.survived if not final else min(campaign.survived, cases - 1),
        accepted_corrupt=len({step for _, step in ledger.corrupt}),
        lost_acknowledged=len(ledger.lost),
        writes_outside=len(ledger.outside),
        cases_by_kind={f"aimed at {aim}": n for aim, n in sorted(campaign.aims.items())},
        acknowledged=len(ledger.acked),
        excluded={"deleted by retention, as the policy asks": len(ledger.dropped_by_retention)},
        command=command,
        seconds=round(time.monotonic() - started, 1),
        details={
            "level": level,
            "seed": seed,
            "kills_aimed_at": dict(campaign.aims),
            "kills_landed": dict(campaign.landed),
            "saves_announced": len(ledger.announced),
            "saves_acknowledged": len(ledger.acked),
            "acknowledged_dropped_by_retention": len(ledger.dropped_by_retention),
            "retention_passes": len(ledger.passes),
            "steps_at_end": len(listed),
            "leftovers_seen": campaign.seen_leftovers,
            "leftovers_collected_after_grace": campaign.collected,
            "job_errors": dict(campaign.job_errors),
            "save_window_seconds": round(_save_window(campaign.durations), 4),
            "seconds_in": {k: round(v, 1) for k, v in campaign.phases.items()},
            "failures": campaign.messages[:30],
        },
    )


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
