"""Rank-death harness: one of four gloo ranks is SIGKILLed in the middle of a collective save.

Each case starts four real ``torch.distributed`` (gloo) rank processes
(:mod:`reliability.rankdeath_worker`, forked from a server with torch already
imported) on one embedded store. They resume from the newest checkpoint, save
step ``n`` together, then save step ``n + 1`` -- and one rank, the *victim*,
SIGKILLs itself at a seeded point of that save: before one of the save's
collectives (the staging decision, the gathering of the ranks' records, the
commit's outcome), before or halfway through writing its rank file, just before
or just after the coordinator publishes the checkpoint, or at a random moment.
Every :data:`STOP_EVERY`-th case the victim instead SIGSTOPs itself before one
of the collectives: alive, its connections open, silent -- the failure that
only the collective timeout can end (a SIGKILL closes the sockets, so gloo
fails at once). The next case's ranks are the restart.

Invariants checked for every case (a case survives when all hold):

(a) *No hang.* Every surviving rank finishes within the collective timeout
    (plus start-up): it raises ``RankLostError`` or ``RankFailedError`` -- a
    clear error of mouthguard's, never a raw backend exception -- or, when the
    victim died after the commit's last collective, acknowledges the save.
(b) *No partial checkpoint.* Every step the store lists loads byte-exact for
    every rank (read from this process, one rank's part at a time); the step
    in flight is listed only if it was committed whole.
(c) *No acknowledged save lost.* Every step any rank acknowledged is listed.
(d) *Restart.* The next case's ranks all resume from the newest listed step,
    byte-exact.
(e) *Debris is collected.* ``collect_garbage(grace_seconds=0)`` leaves no
    staging directory and no temporary file, and the listed steps unchanged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch.distributed as dist

import mouthguard
from mouthguard.errors import MouthguardError
from reliability.crash_worker import same_state
from reliability.powerloss import RankView
from reliability.rankdeath_worker import RUN, Plan, random_plan, rank_main, shard, stop_plan
from reliability.record import HarnessResult, Level

WORLD = 4
#: Collective timeout of the ranks in the harness (the library's default is minutes).
TIMEOUT = 10.0
#: Seconds a case may take to start its ranks (fork, gloo rendezvous) on a loaded box.
STARTUP = 60.0
CLEAR_ERRORS = ("RankLostError", "RankFailedError")
#: Every STOP_EVERY-th case the victim stops (SIGSTOP) instead of dying: alive, silent,
#: its sockets open, so only the collective timeout can end the survivors' wait.
STOP_EVERY = 10
#: The save's collectives, in order (see :mod:`mouthguard.checkpoint.committer`).
_COLLECTIVES = {
    1: "before the staging decision",
    2: "before gathering the ranks' records",
    3: "before hearing the commit's outcome",
}
_LABELS = {
    "before_file": "before writing its rank file",
    "mid_file": "halfway through its rank file",
    "before_publish": "coordinator, before publishing",
    "after_publish": "coordinator, just after publishing",
}


@dataclass(frozen=True)
class Params:
    """How much one level tries."""

    deaths: int
    seed: int


LEVELS: dict[str, Params] = {
    "ci": Params(deaths=20, seed=20261125),
    "soak": Params(deaths=200, seed=11),
}


@dataclass
class Case:
    """What the ranks of one case said, and how they ended."""

    events: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    exitcodes: dict[int, int | None] = field(default_factory=dict)
    hung: list[int] = field(default_factory=list)

    def of(self, rank: int, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events.get(rank, []) if e[0] == kind]


def run_case(ctx: Any, store_dir: Path, victim: int, plan: Plan, timeout: float) -> Case:
    """Start the four ranks, let the victim die as planned, collect how every rank ended.

    A stopped victim (``stop`` plan) never closes its pipe: it is SIGKILLed once
    every other rank has ended, as an operator would clear a hung process.
    """
    tcp = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not re-exported for mypy
        "127.0.0.1",
        0,
        WORLD,
        is_master=True,
        wait_for_workers=False,
        timeout=dt.timedelta(seconds=STARTUP + timeout),
    )
    readers: dict[Connection, int] = {}
    procs = []
    for rank in range(WORLD):
        reader, writer = ctx.Pipe(duplex=False)
        mine = plan if rank == victim else None
        proc = ctx.Process(
            target=rank_main,
            args=(str(store_dir), rank, WORLD, tcp.port, mine, timeout, writer),
            daemon=True,
        )
        proc.start()
        writer.close()
        readers[reader] = rank
        procs.append(proc)
    case = Case(events={r: [] for r in range(WORLD)})
    deadline = time.monotonic() + STARTUP + 3 * timeout
    open_readers = list(readers)
    while open_readers and (left := deadline - time.monotonic()) > 0:
        for conn in wait(open_readers, timeout=left):
            assert isinstance(conn, Connection)
            try:
                case.events[readers[conn]].append(conn.recv())
            except (EOFError, OSError):
                open_readers.remove(conn)
        if plan[0] == "stop" and [readers[c] for c in open_readers] == [victim]:
            procs[victim].kill()  # the survivors have given up on it: clear it
    for rank, proc in enumerate(procs):
        proc.join(timeout=max(0.0, deadline - time.monotonic()) + 1)
        if proc.is_alive():
            case.hung.append(rank)
            proc.kill()
            proc.join(timeout=30)
        case.exitcodes[rank] = proc.exitcode
    del tcp
    return case


@dataclass
class Ledger:
    """What the harness knows across cases."""

    acked: set[int] = field(default_factory=set)
    listed: list[int] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)
    corrupt: set[int] = field(default_factory=set)


def _load_all_ranks(store: mouthguard.Store, step: int) -> bool:
    for rank in range(WORLD):
        ckpt = mouthguard.Checkpointer(store, RUN, background=False)
        ckpt.ranks = RankView(rank, WORLD)
        if not same_state(ckpt.load(step).state, shard(step, rank)):
            return False
    return True


def judge(case: Case, victim: int, store_dir: Path, ledger: Ledger, timeout: float) -> list[str]:
    """Invariants (a)-(e) for one case (d: of the resume this case began with)."""
    failures: list[str] = []
    for rank in range(WORLD):
        failures.extend(f"rank {rank} crashed: {e[1]}" for e in case.of(rank, "crashed"))
        for _, step, exact in case.of(rank, "resumed"):
            newest = ledger.listed[-1] if ledger.listed else None
            if step != newest or not exact:
                failures.append(f"(d) rank {rank} resumed {step} (exact={exact}), newest {newest}")
    if case.exitcodes.get(victim) != -9:
        failures.append(
            f"victim rank {victim} ended with {case.exitcodes.get(victim)}, not SIGKILL"
        )
    limit = STARTUP + 3 * timeout
    failures.extend(f"(a) rank {r} still running {limit:.0f} s in: hung" for r in case.hung)
    saving = {e[1] for r in range(WORLD) for e in case.of(r, "saving")}
    for rank in range(WORLD):
        if rank == victim:
            continue
        for _, _step, kind, message, seconds in case.of(rank, "raised"):
            if kind not in CLEAR_ERRORS:
                failures.append(f"(a) rank {rank} raised {kind}: {message}")
            if seconds > timeout * 2.5:
                failures.append(f"(a) rank {rank} took {seconds:.1f} s to raise ({kind})")
        ended = case.of(rank, "raised") or [e for e in case.of(rank, "acked") if e[1] in saving]
        if not ended and rank not in case.hung and not case.of(rank, "crashed"):
            failures.append(f"(a) rank {rank} neither raised nor acknowledged the save")
    ledger.acked |= {e[1] for r in range(WORLD) for e in case.of(r, "acked")}
    store = mouthguard.open_store(store_dir)
    ckpt = mouthguard.Checkpointer(store, RUN, background=False)
    listed = ckpt.steps()
    for step in listed:
        try:
            if not _load_all_ranks(store, step):
                ledger.corrupt.add(step)
                failures.append(f"(b) step {step} loaded with wrong bytes")
        except MouthguardError as exc:
            failures.append(f"(b) listed step {step} does not load: {exc}")
    for step in sorted(ledger.acked - set(listed)):
        if step not in ledger.lost:
            ledger.lost.add(step)
            failures.append(f"(c) acknowledged step {step} is gone")
    ckpt.collect_garbage(grace_seconds=0)
    debris = [
        str(p.relative_to(store_dir))
        for p in (store_dir / "fast" / RUN).iterdir()
        if ".partial-" in p.name or p.name.startswith(".")
    ]
    debris += [str(p) for p in (store_dir / "fast" / RUN).glob("*/.tmp-*")]
    if debris:
        failures.append(f"(e) left after gc: {debris}")
    if ckpt.steps() != listed:
        failures.append(f"(e) gc changed the committed steps: {listed} -> {ckpt.steps()}")
    ledger.listed = listed
    return failures


def run(
    level: Level = "ci", *, deaths: int | None = None, seed: int | None = None
) -> HarnessResult:
    """Run the rank-death harness at ``level`` (``deaths``/``seed`` override the level's)."""
    params = LEVELS[level]
    deaths = params.deaths if deaths is None else deaths
    seed = params.seed if seed is None else seed
    started = time.monotonic()
    rng = random.Random(seed)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["reliability.rankdeath_worker"])
    kinds: Counter[str] = Counter()
    messages: list[str] = []
    errors: Counter[str] = Counter()
    waits: list[float] = []  # a survivor's seconds from the start of the save to its error
    survived = 0
    ledger = Ledger()
    collectives = 3
    with tempfile.TemporaryDirectory(prefix="mouthguard-rankdeath-") as tmp:
        store_dir = Path(tmp) / "store"
        mouthguard.open_store(store_dir)
        for n in range(deaths):
            stop = n % STOP_EVERY == STOP_EVERY - 1
            plan = stop_plan(rng, collectives) if stop else random_plan(rng, collectives)
            victim = 0 if plan[0].endswith("publish") else rng.randrange(WORLD)
            case = run_case(ctx, store_dir, victim, plan, TIMEOUT)
            failures = judge(case, victim, store_dir, ledger, TIMEOUT)
            kind = _LABELS.get(plan[0], plan[0])
            if plan[0] in ("collective", "stop"):
                kind = _COLLECTIVES.get(int(plan[1]), f"before collective {int(plan[1])}")
                kind = f"stopped (SIGSTOP), {kind}" if plan[0] == "stop" else kind
            if plan[0] == "timer":
                after = any(
                    e[1] in {s[1] for s in case.of(victim, "saving")}
                    for e in case.of(victim, "acked")
                )
                kind = "random moment, after the save" if after else "random moment"
            kinds[kind] += 1
            errors.update(e[2] for r in range(WORLD) for e in case.of(r, "raised"))
            waits.extend(e[4] for r in range(WORLD) for e in case.of(r, "raised"))
            collectives = next(
                (e[2] for r in range(WORLD) for e in case.of(r, "saving")), collectives
            )
            survived += not failures
            messages.extend(f"death {n + 1} ({kind}, rank {victim}): {f}" for f in failures)
    return HarnessResult(
        harness="rankdeath",
        what=(
            "4 gloo ranks saving a sharded checkpoint; one SIGKILLed at a seeded point of "
            "the save (before a collective, before or halfway through its rank file, around "
            "the coordinator's publish, or at a random moment), or, every "
            f"{STOP_EVERY}th case, SIGSTOPped before a collective (alive and silent: only "
            "the timeout ends the wait); survivors must raise a "
            f"clear error within the collective timeout ({TIMEOUT:g} s here), no partial "
            "checkpoint may be listed, all ranks restart from the newest committed one, "
            "gc removes the debris"
        ),
        cases=deaths,
        survived=survived,
        accepted_corrupt=len(ledger.corrupt),
        lost_acknowledged=len(ledger.lost),
        cases_by_kind=dict(kinds),
        acknowledged=len(ledger.acked),
        not_measured=["writes_outside"],
        command=f".venv/bin/python -m reliability.run --level {level} --only rankdeath",
        seconds=round(time.monotonic() - started, 1),
        details={
            "level": level,
            "seed": seed,
            "collective_timeout_seconds": TIMEOUT,
            "survivor_errors": dict(errors),
            # From the start of the killed save, so an upper bound on the time from the death.
            "survivor_seconds_to_error_max": round(max(waits, default=0.0), 2),
            "survivor_seconds_to_error_median": round(statistics.median(waits or [0.0]), 2),
            "steps_at_end": len(ledger.listed),
            "failures": messages[:30],
        },
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m reliability.rankdeath``: run the harness alone, print its JSON."""
    parser = argparse.ArgumentParser(prog="python -m reliability.rankdeath")
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--deaths", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    result = run(args.level, deaths=args.deaths, seed=args.seed)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
