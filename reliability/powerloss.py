"""Power-loss harness: record real saves, replay every crash state a power loss may leave.

SIGKILL (the ``crash`` harness) never tests durability: the kernel keeps the
page cache, so whatever the process wrote survives, fsynced or not. Here each
*variant* runs real saves into an embedded default store (two local tiers)
while :class:`~reliability.fsrecord.Recorder` logs every file-system mutation
under the store; :mod:`reliability.crashstates` then enumerates, for every
point of the log, the on-disk states its persistence model allows (unsynced
data lost or torn at page granularity, names not followed by an ``fsync`` of
their directory lost, nothing reordered across an ``fsync``). Each distinct
state is written to a fresh directory and checked:

(a) *Opens.* ``open_store`` and ``Checkpointer.steps()`` do not raise.
(b) *Byte-exact.* Every committed copy, read through each tier alone, loads
    with exactly the bytes that were saved (other bytes count in
    ``accepted_corrupt``); a committed copy that is rejected fails the state
    (a manifest must never persist without the bytes it vouches for).
(c) *Acknowledged saves survive.* Every save acknowledged before the crash
    point (``save`` or ``handle.result()`` returned: durable on the fast tier,
    by contract) is listed and loads, unless retention had announced it would
    delete it (the driver marks that before the pass); others missing count in
    ``lost_acknowledged``.
(d) *Newest.* ``load()`` returns the newest listed step, without a fallback.
(e) *Verify.* ``verify_and_record`` finds no damaged copy.
(f) *Housekeeping keeps what is needed.* ``collect_garbage(grace_seconds=0)``
    and a retention pass after the crash leave every acknowledged milestone and
    critical step and the newest acknowledged step loadable.

Variants: ``sync`` (routine, milestone and critical saves with ``save``),
``async`` (``save_async``), ``replication`` (a replication pass after each
save, so copies to the second tier are cut too), ``retention`` (enough routine
saves for retention to trash and, trash delay 0, purge on the next pass, with
``collect_garbage`` between passes), ``multirank`` (two real gloo ranks
saving one sharded checkpoint, recorded into one log), and ``dcp`` (three saves
through ``torch.distributed.checkpoint`` and mouthguard's DCP ``Writer``,
loaded back through its ``Reader``: :mod:`reliability.powerloss_dcp`), and
``pack`` (``data pack`` committing a dataset of several shards, judged by its
own rule -- nothing committed, or every sample byte-exact, and there once
acknowledged: :mod:`reliability.powerloss_pack`).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mouthguard
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import find_copies, verify_and_record
from mouthguard.errors import MouthguardError
from mouthguard.format.typed_json import JsonValue
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.policy.config import PolicyConfig
from reliability import powerloss_dcp, powerloss_pack
from reliability.crash_worker import importance_for, same_state, state_for
from reliability.crashstates import CrashState, Log, candidates, replay
from reliability.fsrecord import Recorder, read_log
from reliability.record import HarnessResult, Level

ROOT = Path(__file__).resolve().parents[1]
RUN = "powerloss"
#: float32 elements of a routine save's big tensor: a few pages, so writes can tear.
ELEMENTS = 3 * 1024
POLICY = PolicyConfig(trash_delay_seconds=0.0)
MULTIRANK_WORLD = 2
STEPS_MULTIRANK = (3, 4)


@dataclass(frozen=True)
class Params:
    """How much one level explores."""

    states: int | None  # distinct states to check per run (None: every one)
    seed: int


LEVELS: dict[str, Params] = {
    # 120 per variant, raised to the variant's crash points: each gets a state.
    "ci": Params(states=120 * 7, seed=20261125),
    "soak": Params(states=None, seed=7),
}


def expected(step: int) -> Any:
    """The state saved at ``step`` in every variant."""
    return state_for(step, ELEMENTS)


# --- recording ---------------------------------------------------------------------


def _save(ckpt: mouthguard.Checkpointer, rec: Recorder, step: int, mode: str) -> None:
    importance = importance_for(step)
    if mode == "async":
        ckpt.save_async(step, expected(step), importance=importance).result()
    else:
        ckpt.save(step, expected(step), importance=importance)
    rec.mark(ev="acked", step=step)


def _retention(store: Store, rec: Recorder) -> None:
    plan = apply_retention(store, POLICY, runs=[RUN], dry_run=True)
    doomed = sorted({a.step for a in plan.actions if a.action.action in ("trash", "purge")})
    rec.mark(ev="may_delete", steps=doomed)
    apply_retention(store, POLICY, runs=[RUN])


def record_variant(variant: str, store_dir: Path, log: Path) -> None:
    """Run one variant's saves in this process, recording under ``store_dir``."""
    with Recorder(store_dir, log) as rec:
        store = mouthguard.open_store(store_dir)
        ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
        if variant in ("sync", "async"):
            for step in (2, 3, 4, 11, 12):  # routine, routine, milestone, routine, critical
                _save(ckpt, rec, step, variant)
        elif variant == "replication":
            replicator = Replicator(store)
            for step, mode in ((3, "sync"), (4, "async"), (12, "sync")):
                _save(ckpt, rec, step, mode)
                replicator.run_once(runs=[RUN])
        elif variant == "retention":
            for step in (0, 1, 2, 3, 5, 6):  # routine only: retention keeps the last 3
                _save(ckpt, rec, step, "sync")
                if step >= 3:
                    _retention(store, rec)
                    ckpt.collect_garbage(grace_seconds=0)
            _retention(store, rec)  # trash delay 0: this pass purges what the last trashed
        else:
            raise ValueError(f"unknown variant {variant!r}")
        ckpt.close()


def record_multirank(store_dir: Path, log: Path) -> None:
    """Two gloo ranks save steps 3 and 4 together, each recording into ``log``."""
    import datetime as dt  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415 - only this variant needs it

    world = {"op": "mark", "ev": "world", "size": MULTIRANK_WORLD}
    log.write_bytes(json.dumps(world).encode() + b"\n")
    # The rendezvous store is held here for the ranks' whole life (port 0: never a race).
    tcp = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not re-exported for mypy
        "127.0.0.1",
        0,
        MULTIRANK_WORLD,
        is_master=True,
        wait_for_workers=False,
        timeout=dt.timedelta(seconds=120),
    )
    port = tcp.port
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reliability.powerloss_rank",
                str(store_dir),
                str(log),
                str(rank),
                str(MULTIRANK_WORLD),
                str(port),
            ],
            cwd=ROOT,
        )
        for rank in range(MULTIRANK_WORLD)
    ]
    codes = [p.wait(timeout=120) for p in procs]
    if any(codes):
        raise RuntimeError(f"multi-rank recording failed: exit codes {codes}")


VARIANTS: dict[str, Callable[[Path, Path], None]] = {
    "sync": lambda d, lg: record_variant("sync", d, lg),
    "async": lambda d, lg: record_variant("async", d, lg),
    "replication": lambda d, lg: record_variant("replication", d, lg),
    "retention": lambda d, lg: record_variant("retention", d, lg),
    "multirank": record_multirank,
    "dcp": lambda d, lg: powerloss_dcp.record_dcp(RUN, ELEMENTS, d, lg),
    "pack": powerloss_pack.record_pack,
}


# --- checking one state --------------------------------------------------------------


@dataclass
class Verdict:
    """What one crash state broke (empty lists: it survived)."""

    failures: list[str] = field(default_factory=list)
    corrupt: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    deleted_by_retention: set[int] = field(default_factory=set)


def rank_expected(step: int, rank: int, world: int) -> Any:
    """The state rank ``rank`` of ``world`` saved at ``step`` (``expected`` when alone)."""
    return expected(step) if world == 1 else state_for(step * 100 + rank, ELEMENTS)


class RankView(RankGroup):
    """Rank ``rank`` of ``world``, seen from one process: loads that rank's part alone.

    The checker reads each rank's part of a multi-rank checkpoint in turn; every
    collective answers as if every rank had said the same.
    """

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size = rank, world

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """``value`` as every rank's answer."""
        return [value] * self.world_size


def _checkpointers(store: Store, world: int, *, dcp: bool = False) -> list[Any]:
    """One view per rank: a ``Checkpointer`` (its ranks faked), or the DCP view."""
    if dcp:
        return [powerloss_dcp.DcpView(store, RUN, ELEMENTS)]
    views: list[Any] = []
    for rank in range(world):
        ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
        if world > 1:
            ckpt.ranks = RankView(rank, world)
        views.append(ckpt)
    return views


def _exact(loaded: Any, step: int, rank: int = 0, world: int = 1, *, dcp: bool = False) -> bool:
    if dcp:
        return same_state(loaded.state, powerloss_dcp.dcp_expected(step, ELEMENTS))
    return same_state(loaded.state, rank_expected(step, rank, world))


def check_state(directory: Path, log: Log, state: CrashState) -> Verdict:
    """Invariants (a)-(f) of the module docstring for the state written in ``directory``."""
    v = Verdict()
    # The variant is the recording's, whatever the crash point: look at the whole log.
    kinds = {m["ev"] for m in log.marks_before(len(log.ops))}
    if powerloss_pack.MARK in kinds:
        v.failures = powerloss_pack.check_pack_state(directory, log, state)
        if any(f.startswith("(c)") for f in v.failures):
            v.lost.add(0)
        if any(f.startswith("(b)") for f in v.failures):
            v.corrupt.add(0)
        return v
    acked: set[int] = set()
    may_delete: set[int] = set()
    world = 1
    dcp = powerloss_dcp.MARK in kinds
    for mark in log.marks_before(state.k):
        if mark["ev"] == "acked":
            acked.add(mark["step"])
        elif mark["ev"] == "may_delete":
            may_delete |= set(mark["steps"])
        elif mark["ev"] == "world":
            world = mark["size"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = mouthguard.open_store(directory)
            views = _checkpointers(store, world, dcp=dcp)
            listed = views[0].steps()
        except MouthguardError as exc:
            v.failures.append(f"(a) store unopenable: {exc}")
            return v
        _check_copies(store, world, v, dcp=dcp)
        v.deleted_by_retention = (acked & may_delete) - set(listed)
        for step in sorted(acked - may_delete - set(listed)):
            v.lost.add(step)
            v.failures.append(f"(c) acknowledged step {step} is gone")
        for rank, ckpt in enumerate(views if listed else []):
            try:
                newest = ckpt.load()
                exact = _exact(newest, newest.step, rank, world, dcp=dcp)
                if newest.step != listed[-1] or not exact:
                    v.failures.append(f"(d) load() gave step {newest.step}, newest {listed[-1]}")
            except MouthguardError as exc:
                v.failures.append(f"(d) load() on rank {rank} failed: {exc}")
        for ref in find_copies(store, RUN):
            verdict = verify_and_record(ref)
            if verdict.damaged:
                v.failures.append(f"(e) verify: {ref.tier.name} step {ref.step}: {verdict.reason}")
        _check_housekeeping(store, views, acked - may_delete, v, dcp=dcp)
    v.failures.extend(f"warning: {w.message}" for w in caught)
    return v


def _check_copies(store: Store, world: int, v: Verdict, *, dcp: bool = False) -> None:
    for tier in store.tiers:
        alone = Store([tier], source=f"{store.source}:{tier.name}")
        for rank, ckpt in enumerate(_checkpointers(alone, world, dcp=dcp)):
            for step in ckpt.steps():
                try:
                    loaded = ckpt.load(step)
                except MouthguardError as exc:
                    v.failures.append(f"(b) committed step {step} on {tier.name} rejected: {exc}")
                    continue
                if not _exact(loaded, step, rank, world, dcp=dcp):
                    v.corrupt.add(step)
                    v.failures.append(f"(b) step {step} rank {rank} on {tier.name}: wrong bytes")


def _check_housekeeping(
    store: Store, views: list[Any], acked: set[int], v: Verdict, *, dcp: bool = False
) -> None:
    views[0].collect_garbage(grace_seconds=0)
    apply_retention(store, POLICY, runs=[RUN])
    needed = {s for s in acked if importance_for(s) != "routine"}
    if acked:
        needed.add(max(acked))
    for step in sorted(needed):
        for rank, ckpt in enumerate(views):
            try:
                if not _exact(ckpt.load(step), step, rank, len(views), dcp=dcp):
                    v.corrupt.add(step)
                    v.failures.append(f"(f) step {step} wrong after gc and retention")
            except MouthguardError as exc:
                v.lost.add(step)
                v.failures.append(f"(f) step {step} lost to gc or retention: {exc}")


# --- the run -----------------------------------------------------------------------


@dataclass
class Tally:
    """Counts over one run."""

    states: Counter[str] = field(default_factory=Counter)
    crash_points: Counter[str] = field(default_factory=Counter)
    points_covered: Counter[str] = field(default_factory=Counter)
    candidates: Counter[str] = field(default_factory=Counter)
    survived: int = 0
    corrupt: set[tuple[str, int]] = field(default_factory=set)
    lost: set[tuple[str, int]] = field(default_factory=set)
    deleted_by_retention: set[tuple[str, int]] = field(default_factory=set)
    acknowledged: int = 0
    messages: list[str] = field(default_factory=list)


def explore(variant: str, base: Path, budget: int | None, rng: random.Random, tally: Tally) -> None:
    """Record ``variant`` once, then check up to ``budget`` distinct crash states of it."""
    store_dir, log_path = base / f"{variant}-store", base / f"{variant}.log"
    store_dir.mkdir()
    root_ino = store_dir.stat().st_ino
    VARIANTS[variant](store_dir, log_path)
    log = Log.resolve(read_log(log_path), root_ino)
    tally.acknowledged += sum(1 for m in log.marks_before(len(log.ops)) if m["ev"] == "acked")
    points = [list(candidates(log, k)) for k in range(len(log.ops) + 1)]
    every = [s for states in points for s in states]
    tally.crash_points[variant] = len(points)
    tally.candidates[variant] = len(every)
    if budget is not None:
        every = _covering_order(points, rng)
        # Every crash point gets a state, whatever the budget: a point left out is
        # a point whose crash nobody checked.
        budget = max(budget, len(points))
    seen: set[str] = set()
    covered: set[int] = set()
    for state in every:
        if budget is not None and len(seen) >= budget:
            break
        image = replay(log, state)
        digest = image.digest()
        if digest in seen:
            covered.add(state.k)  # the same on-disk state as one checked: covered
            continue
        seen.add(digest)
        covered.add(state.k)
        directory = base / "state"
        image.write_to(directory)
        try:
            verdict = check_state(directory, log, state)
        except Exception as exc:  # the store broke the checker: a failed state
            verdict = Verdict(failures=[f"checking raised {type(exc).__name__}: {exc}"])
        finally:
            shutil.rmtree(directory)
        tally.states[variant] += 1
        tally.survived += not verdict.failures
        tally.corrupt |= {(variant, s) for s in verdict.corrupt}
        tally.lost |= {(variant, s) for s in verdict.lost}
        tally.deleted_by_retention |= {(variant, s) for s in verdict.deleted_by_retention}
        if verdict.failures and len(tally.messages) < 30:
            tally.messages.append(
                f"{variant} k={state.k} ({state.how}): " + "; ".join(verdict.failures[:3])
            )
    tally.points_covered[variant] = len(covered)


def _covering_order(points: list[list[CrashState]], rng: random.Random) -> list[CrashState]:
    """Every crash point's states, shuffled, one state of each point first.

    A plain shuffle of all the states leaves some crash points without a state
    when the budget is smaller than the population; here the first
    ``len(points)`` states cover each point once (in a shuffled order), then
    the rest follow shuffled.
    """
    firsts: list[CrashState] = []
    rest: list[CrashState] = []
    for states in points:
        shuffled = list(states)
        rng.shuffle(shuffled)
        firsts.extend(shuffled[:1])
        rest.extend(shuffled[1:])
    rng.shuffle(firsts)
    rng.shuffle(rest)
    return firsts + rest


def run(
    level: Level = "ci", *, states: int | None = None, seed: int | None = None
) -> HarnessResult:
    """Run the power-loss harness at ``level`` (``states``/``seed`` override the level's)."""
    params = LEVELS[level]
    total = params.states if states is None else states
    seed = params.seed if seed is None else seed
    started = time.monotonic()
    rng = random.Random(seed)
    tally = Tally()
    budget = None if total is None else -(-total // len(VARIANTS))
    quiet = logging.getLogger("mouthguard")
    level_before = quiet.level
    quiet.setLevel(logging.ERROR)  # every purge logs a line; thousands of states would flood
    try:
        with tempfile.TemporaryDirectory(prefix="mouthguard-powerloss-") as tmp:
            for variant in VARIANTS:
                base = Path(tmp) / variant
                base.mkdir()
                explore(variant, base, budget, rng, tally)
    finally:
        quiet.setLevel(level_before)
    cases = tally.states.total()
    return HarnessResult(
        harness="powerloss",
        what=(
            "power loss after every recorded file-system operation of real saves (sync, "
            "async, replication to a second tier, retention trashing and purging with gc, "
            "two gloo ranks, torch.distributed.checkpoint, data pack), replayed under a "
            "stated "
            "model: unsynced data lost or torn by page, names not followed by a "
            "directory fsync lost, nothing reordered across an fsync; one case is one "
            "distinct on-disk state, opened, loaded per copy, verified, then gc and "
            "retention run on it"
        ),
        cases=cases,
        survived=tally.survived,
        accepted_corrupt=len(tally.corrupt),
        lost_acknowledged=len(tally.lost),
        cases_by_kind={f"{v} saves": n for v, n in tally.states.items()},
        acknowledged=tally.acknowledged,
        excluded={
            "deleted by retention, as the policy asks (gone in some state cut after the "
            "pass was announced)": len(tally.deleted_by_retention)
        },
        not_measured=["writes_outside"],
        command=f".venv/bin/python -m reliability.run --level {level} --only powerloss",
        seconds=round(time.monotonic() - started, 1),
        details={
            "level": level,
            "seed": seed,
            "crash_points": dict(tally.crash_points),
            "crash_points_covered": dict(tally.points_covered),
            "candidate_states": dict(tally.candidates),
            "failures": tally.messages,
        },
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m reliability.powerloss``: run the harness alone, print its JSON."""
    parser = argparse.ArgumentParser(prog="python -m reliability.powerloss")
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--states", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    result = run(args.level, states=args.states, seed=args.seed)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
