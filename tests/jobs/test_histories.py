"""Random histories against a real on-disk store, with every safety rule checked after every step.

A hypothesis state machine saves checkpoints of random importance, promotes and
demotes them, holds and releases them, replicates, applies retention at a
simulated clock, advances that clock past and short of the trash delay, crashes
saves and replication passes part-way through a put, and flips bytes of random
copies. After every rule the whole store is read back with the real reader and
compared with a model:

* every copy on disk either loads byte-exact (the tensors and plain values the
  model derives from the step) or is a copy the test itself damaged;
* a copy only disappears when the test damaged it (set aside by replication or
  scrub), when retention purged it after the trash delay, or when retention
  demoted an unpinned fast copy of a kept checkpoint that has another intact copy;
* held checkpoints, critical checkpoints and those retention kept at the last
  pass keep an intact copy, unless the test damaged every copy of them;
* ``list()`` shows exactly the committed steps (no staging debris of a crashed
  save or copy), with the importance and holds the model expects, and
  ``load(step)`` returns the exact state;
* after a clean replication pass every undamaged, untrashed checkpoint is protected.

Retention's decisions are checked against the model's own reading of the rules
(held, critical, the newest checkpoint and the newest proven-valid one, keep-last
per level), and every trash mark must wait the policy's delay before a purge.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import mouthguard
from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import load_copy, read_manifest
from mouthguard.errors import (
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MouthguardError,
    NoValidCheckpointError,
    TierError,
)
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.jobs.scrub import scrub
from mouthguard.policy.config import PolicyConfig, default_levels
from mouthguard.policy.importance import Importance, parse_importance
from tests.checkpoint.helpers import assert_same, flip_byte
from tests.jobs.histories_support import (
    RUN,
    CrashingTier,
    CrashKind,
    SimulatedCrash,
    UnsyncedLocalTier,
    expected_state,
)

TRASH_DELAY = 100.0
#: A legal, tighter policy than the default, so that histories of a few dozen steps
#: drop (trash, purge, demote) checkpoints often: keep the last routine save and
#: the last two milestones; a 100 s trash delay.
POLICY = PolicyConfig(
    trash_delay_seconds=TRASH_DELAY,
    levels={
        Importance.ROUTINE: replace(default_levels()[Importance.ROUTINE], keep_last=1),
        Importance.MILESTONE: replace(default_levels()[Importance.MILESTONE], keep_last=2),
    },
)
TIERS = (("fast", "node-a"), ("durable", "node-b"), ("archive", "region-1"))
LEVELS = ("transient", "routine", "milestone", "critical", "golden")
HOLD_NAMES = ("legal", "ops")

Copy = tuple[int, str]  # (step, tier name)

picks = st.integers(min_value=0, max_value=1000)
crash_kinds = st.sampled_from(CrashKind)
crash_bytes = st.integers(min_value=0, max_value=6000)


class StoreHistories(RuleBasedStateMachine):
    """One random history of one run on a fresh 2- or 3-tier store."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="mouthguard-history-"))
        self.policy = POLICY
        self.store: mouthguard.Store | None = None
        self.now = float(int(time.time()))  # the simulated clock retention runs at
        self.next_step = 1
        self.importance: dict[int, Importance] = {}  # every step ever committed
        self.holds: dict[int, set[str]] = {}
        self.corrupted: set[Copy] = set()  # copies the test damaged, still on disk
        self.lost: set[int] = set()  # steps the test damaged on every copy
        self.kept_at_gc: set[int] = set()  # retention's keep decisions at the last pass
        self.trash_marks: dict[Copy, float] = {}  # first trash mark of a copy (simulated time)
        self.copies: dict[Copy, bool] = {}  # the last scan: copy -> loads byte-exact
        self.removed_by_gc: set[Copy] = set()  # removals the gc rule already justified
        self.crashed_step: int | None = None  # a step whose save crashed, not yet retried

    # --- plumbing ----------------------------------------------------------------

    @initialize(ntiers=st.sampled_from([2, 3]))
    def build_store(self, ntiers: int) -> None:
        tiers = [
            UnsyncedLocalTier(str(self.root / name), name, domain)
            for name, domain in TIERS[:ntiers]
        ]
        self.store = mouthguard.Store(tiers, policy=self.policy)
        self.ckpt = mouthguard.Checkpointer(self.store, run=RUN, background=False)

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def mg(self) -> mouthguard.Store:
        assert self.store is not None
        return self.store

    def _present_steps(self) -> list[int]:
        return sorted({step for step, _ in self.copies})

    def _pick(self, index: int) -> int:
        steps = self._present_steps()
        return steps[index % len(steps)]

    def _intact(self, step: int) -> list[str]:
        return [t for (s, t), ok in self.copies.items() if s == step and ok]

    def _scan(self) -> dict[Copy, bool]:
        """Read every committed copy on every tier with the real reader."""
        found: dict[Copy, bool] = {}
        for tier in self.mg.tiers:
            for step in catalog.committed_steps(tier, RUN):
                try:
                    manifest = read_manifest(tier, RUN, step)
                    state = load_copy(tier, catalog.checkpoint_prefix(RUN, step), manifest)
                except MouthguardError:
                    found[(step, tier.name)] = False
                    continue
                assert step in self.importance, f"step {step} on {tier.name} was never committed"
                assert_same(state, expected_state(step))  # never a wrong state
                found[(step, tier.name)] = True
        return found

    def _has_holder(self, step: int) -> bool:
        return bool(self.holds.get(step))

    # --- rules: the training job -------------------------------------------------

    @rule(levels=st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4))
    def save(self, levels: list[str]) -> None:
        """A few saves of the training loop, one step after another."""
        for level in levels:
            step = self.next_step
            info = self.ckpt.save(step, expected_state(step), importance=level)
            assert info.step == step and info.importance is parse_importance(level)
            self._committed(step, level)

    def _committed(self, step: int, level: str) -> None:
        self.importance[step] = parse_importance(level)
        self.holds[step] = set()
        self.next_step = step + 1
        self.crashed_step = None

    @rule(
        level=st.sampled_from(LEVELS),
        put_index=st.integers(min_value=0, max_value=2),
        after=crash_bytes,
        kind=crash_kinds,
    )
    def crash_mid_save(self, level: str, put_index: int, after: int, kind: CrashKind) -> None:
        """A save whose fast-tier put fails (or whose process dies) part-way."""
        step = self.next_step
        fast = CrashingTier(self.mg.fast, put_index=put_index, after_bytes=after, kind=kind)
        crashing = mouthguard.Store([fast, *self.mg.tiers[1:]], policy=self.policy)
        saver = mouthguard.Checkpointer(crashing, run=RUN, background=False)
        try:
            saver.save(step, expected_state(step), importance=level)
        except (SimulatedCrash, TierError):
            assert fast.fired
            self.crashed_step = step  # the next save retries this step number
            return
        assert not fast.fired
        self._committed(step, level)

    @rule(index=picks, level=st.sampled_from(LEVELS))
    @precondition(lambda self: bool(self.copies))
    def set_importance(self, index: int, level: str) -> None:
        step = self._pick(index)
        info = self.ckpt.set_importance(step, level, reason="history")
        self.importance[step] = parse_importance(level)
        assert info.importance is self.importance[step]

    @rule(index=picks, name=st.sampled_from(HOLD_NAMES))
    @precondition(lambda self: bool(self.copies))
    def hold(self, index: int, name: str) -> None:
        step = self._pick(index)
        info = self.ckpt.hold(step, name, reason="history")
        self.holds[step].add(name)
        assert name in info.holds

    @rule(index=picks)
    @precondition(lambda self: any(self.holds.get(s) for s in self._present_steps()))
    def release(self, index: int) -> None:
        held = [s for s in self._present_steps() if self.holds.get(s)]
        step = held[index % len(held)]
        name = sorted(self.holds[step])[index % len(self.holds[step])]
        assert self.ckpt.release(step, name)
        self.holds[step].discard(name)

    @rule(index=picks)
    @precondition(lambda self: bool(self.copies))
    def load_step(self, index: int) -> None:
        step = self._pick(index)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointFallbackWarning)
            if self._intact(step):
                assert_same(self.ckpt.load(step).state, expected_state(step))
            else:
                with pytest.raises(CorruptCheckpointError):
                    self.ckpt.load(step)

    @rule()
    def load_latest(self) -> None:
        intact = [s for s in self._present_steps() if self._intact(s)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointFallbackWarning)
            if intact:
                loaded = self.ckpt.load()
                assert loaded.step == max(intact)
                assert_same(loaded.state, expected_state(loaded.step))
            elif self.copies:
                with pytest.raises(NoValidCheckpointError):
                    self.ckpt.load()
            else:
                with pytest.raises(CheckpointNotFoundError):
                    self.ckpt.load()

    # --- rules: the background jobs and the clock --------------------------------

    @rule()
    def replicate(self) -> None:
        Replicator(self.mg, self.policy).run_once()
        # A clean pass repairs what it can: every checkpoint with an intact copy
        # and no trash mark now meets its placement, verified.
        intact = {s for (s, _), ok in self._scan().items() if ok}
        for step in sorted(intact):
            info = self.ckpt.info(step)
            assert info is not None
            if any(c.trashed_at is not None for c in info.copies):
                continue
            assert info.state == "protected", (step, info.state, info.protection)

    @rule(
        tier_index=picks,
        put_index=st.integers(min_value=0, max_value=4),
        after=crash_bytes,
        kind=crash_kinds,
    )
    def crash_mid_replication(
        self, tier_index: int, put_index: int, after: int, kind: CrashKind
    ) -> None:
        """One replication pass with one tier failing (or the process dying) in a put."""
        victim = self.mg.tiers[tier_index % len(self.mg.tiers)]
        wrapped = CrashingTier(victim, put_index=put_index, after_bytes=after, kind=kind)
        tiers = [wrapped if t is victim else t for t in self.mg.tiers]
        crashing = mouthguard.Store(tiers, policy=self.policy)
        try:
            Replicator(crashing, self.policy).run_once()
        except SimulatedCrash:  # a TierError never escapes a pass: it is a shortfall
            assert kind is CrashKind.KILL

    @rule()
    def scrub_all(self) -> None:
        scrub(self.mg, max_age_seconds=0, now=time.time() + 1)

    @rule(seconds=st.sampled_from([1.0, 30.0, 99.0, 100.0, 101.0, 250.0]))
    def advance_clock(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def collect_garbage(self) -> None:
        self.ckpt.collect_garbage(grace_seconds=0)
        for tier in self.mg.tiers:
            root = Path(tier.location())
            debris = [
                p for p in root.rglob("*") if ".partial-" in p.name or p.name.startswith(".tmp-")
            ]
            assert debris == [], debris

    @rule(index=picks, offset=st.integers(min_value=0, max_value=10_000))
    @precondition(lambda self: any(self.copies.values()))
    def corrupt(self, index: int, offset: int) -> None:
        """Flip one byte of an intact copy's rank file (silent damage: receipts stay)."""
        intact = sorted(c for c, ok in self.copies.items() if ok)
        step, tier_name = intact[index % len(intact)]
        prefix = catalog.checkpoint_prefix(RUN, step)
        path = Path(self.mg.tier(tier_name).location(prefix)) / catalog.rank_file_name(0)
        flip_byte(path, offset % path.stat().st_size)
        self.corrupted.add((step, tier_name))
        self.copies[(step, tier_name)] = False
        if not self._intact(step):
            self.lost.add(step)

    @rule(seconds=st.sampled_from([0.0, 0.0, 50.0, 100.0, 101.0]))
    def gc(self, seconds: float) -> None:
        """Apply retention at the simulated clock; check its decisions and every removal."""
        self.now += seconds
        before = dict(self.copies)
        steps = self._present_steps()
        proven = []
        for step in steps:
            info = self.ckpt.info(step)
            assert info is not None
            if any(c.verified and c.trashed_at is None for c in info.copies):
                proven.append(step)
        expected_keep = self._model_keep(steps, proven)

        report = apply_retention(self.mg, self.policy, now=self.now)

        # The only acceptable failure: a demotion refused because the re-check before
        # the delete found another copy of that step damaged -- by this test.
        failed = [a for a in report.actions if a.error is not None]
        for action in failed:
            assert action.action.action == "demote", action
            assert "failed its re-check" in (action.error or ""), action
            damaged_elsewhere = {
                t for s, t in self.corrupted if s == action.step and t != action.action.tier
            }
            assert damaged_elsewhere, f"demotion refused but the test damaged nothing: {action}"
        assert sorted(d.step for d in report.decisions) == steps
        keep = {d.step for d in report.decisions if d.keep}
        assert keep == expected_keep, {d.step: d.reasons for d in report.decisions}
        self.kept_at_gc = keep
        pinned = self._model_pins(steps, keep)

        after = self._scan()
        for copy in sorted(set(before) - set(after)):
            step, tier = copy
            if copy in self.corrupted:
                continue
            if copy in self.trash_marks:  # purge: a dropped checkpoint, after the delay
                assert step not in keep, f"{copy} purged though retention keeps it"
                delay = self.policy.trash_delay(self.importance[step])
                assert self.now >= self.trash_marks[copy] + delay, f"{copy} purged early"
            else:  # demotion: an unpinned fast copy of a kept checkpoint with another copy
                assert tier == self.mg.fast.name, f"{copy} deleted without a trash mark"
                assert step in keep and step not in pinned, f"{copy} demoted while pinned"
                others = [t for (s, t), ok in after.items() if s == step and ok]
                assert others, f"{copy} demoted: no other intact copy remains"
            self.removed_by_gc.add(copy)
        self._record_trash_marks()

    def _model_keep(self, steps: list[int], proven: list[int]) -> set[int]:
        """What retention must keep, read from the policy's documented rules."""
        keep = {s for s in steps if self._has_holder(s)}
        keep |= {s for s in steps if self.importance[s] is Importance.CRITICAL}
        if steps:
            keep.add(max(steps))  # the newest not known to be invalid (nothing is, here)
        if proven:
            keep.add(max(proven))  # the newest proven valid: a verified live copy
        for level in (Importance.TRANSIENT, Importance.ROUTINE, Importance.MILESTONE):
            limit = self.policy.level(level).keep_last
            own = [s for s in reversed(steps) if self.importance[s] is level]
            keep.update(own if limit is None else own[:limit])
        return keep

    def _model_pins(self, steps: list[int], keep: set[int]) -> set[int]:
        """Fast copies retention must leave: the newest kept, and the newest critical."""
        kept = [
            s
            for s in reversed(steps)
            if s in keep and self.importance[s] is not Importance.TRANSIENT
        ]
        pins = set(kept[: self.policy.fast_keep_newest])
        critical = [s for s in kept if self.importance[s] is Importance.CRITICAL]
        pins.update(critical[:1])
        return pins

    def _record_trash_marks(self) -> None:
        marks: dict[Copy, float] = {}
        for step in self.ckpt.steps():
            info = self.ckpt.info(step, missing_ok=True)
            if info is None:
                continue
            for c in info.copies:
                if c.trashed_at is None:
                    continue
                copy = (step, c.tier)
                first = self.trash_marks.get(copy)
                if first is None:
                    assert c.trashed_at.timestamp() == pytest.approx(self.now), copy
                    first = self.now
                else:
                    assert c.trashed_at.timestamp() == pytest.approx(first), f"{copy}: mark reset"
                marks[copy] = first
        self.trash_marks = marks

    # --- the invariants, after every rule ----------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        if self.store is None:
            return
        scan = self._scan()
        # Damage is only ever the test's own doing; a replaced copy is intact again.
        for copy, ok in scan.items():
            assert ok or copy in self.corrupted, f"copy {copy} is damaged: the test never did that"
        # A copy only goes when it was damaged (set aside) or retention justified it.
        set_aside = {c for c in self.corrupted if c not in scan}
        for copy in set(self.copies) - set(scan):
            assert copy in set_aside or copy in self.removed_by_gc, f"copy {copy} vanished"
        # Nothing is purged before the trash delay: a trashed copy stays until then.
        for copy, marked in self.trash_marks.items():
            if self.now < marked + self.policy.trash_delay(self.importance[copy[0]]):
                assert copy in scan or copy in set_aside, f"{copy} gone before the trash delay"
        self.trash_marks = {c: t for c, t in self.trash_marks.items() if c in scan}
        self.corrupted = {c for c in self.corrupted if scan.get(c) is False}
        self.removed_by_gc = set()
        self.copies = scan

        steps = self._present_steps()
        assert [i.step for i in self.ckpt.list()] == steps  # no debris, nothing missing
        for step in steps:
            if not self._intact(step):
                assert step in self.lost, f"step {step} lost its last intact copy"
            info = self.ckpt.info(step)
            assert info is not None
            assert info.importance is self.importance[step], (step, info.importance)
            assert set(info.holds) == self.holds[step], (step, info.holds)
            first = next(t for t in self.mg.tiers if (step, t.name) in scan)
            if scan[(step, first.name)]:  # reads this copy only: no fallback, no side effect
                assert_same(self.ckpt.load(step).state, expected_state(step))

        must_stay = set(self.kept_at_gc)
        must_stay |= {s for s, names in self.holds.items() if names}
        must_stay |= {s for s, level in self.importance.items() if level is Importance.CRITICAL}
        for step in sorted(must_stay - self.lost):
            assert self._intact(step), f"step {step} must stay but has no intact copy"

        if self.crashed_step is not None:  # the crashed save's staging stays invisible
            assert self.crashed_step not in steps
            with pytest.raises(CheckpointNotFoundError):
                self.ckpt.load(self.crashed_step)


StoreHistories.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreHistories = StoreHistories.TestCase


# --- bugs the histories found (now fixed), kept as regression tests ------------------------------


def _store(root: Path, ntiers: int = 2) -> mouthguard.Store:
    tiers = [UnsyncedLocalTier(str(root / name), name, domain) for name, domain in TIERS[:ntiers]]
    return mouthguard.Store(tiers, policy=POLICY)


def _rank_file(store: mouthguard.Store, tier: str, step: int) -> Path:
    prefix = catalog.checkpoint_prefix(RUN, step)
    return Path(store.tier(tier).location(prefix)) / catalog.rank_file_name(0)


def test_a_failing_receipt_write_does_not_abort_the_pass(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    for step in (1, 2):
        ckpt.save(step, expected_state(step))
    # The first put on the fast tier in a pass is the receipt of step 2's copy there.
    fast = CrashingTier(store.fast, put_index=0, after_bytes=0, kind=CrashKind.ERROR)
    failing = mouthguard.Store([fast, *store.tiers[1:]], policy=store.policy)
    Replicator(failing, store.policy).run_once()
    assert fast.fired
    info = ckpt.info(1)
    assert info is not None and info.state == "protected"


def test_holds_and_importance_survive_a_copy_killed_after_its_commit(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    ckpt.save(1, expected_state(1), importance="routine")
    ckpt.hold(1, "legal")
    ckpt.set_importance(1, "critical")
    # Puts on the new replica: rank file, manifest (commit), then its receipt: die there.
    durable = CrashingTier(store.tiers[1], put_index=2, after_bytes=0, kind=CrashKind.KILL)
    with pytest.raises(SimulatedCrash):
        Replicator(mouthguard.Store([store.fast, durable]), store.policy).run_once()
    Replicator(store, store.policy).run_once()  # the next agent confirms the replica
    flip_byte(_rank_file(store, "fast", 1), -1)  # bit rot on the original copy
    scrub(store, max_age_seconds=0, now=time.time() + 1)  # set aside ...
    Replicator(store, store.policy).run_once()  # ... and repaired from the replica
    info = ckpt.info(1)
    assert info is not None
    assert (info.importance, info.holds) == (Importance.CRITICAL, ("legal",))


def test_a_demotion_never_deletes_the_last_intact_copy(tmp_path: Path) -> None:
    store = _store(tmp_path, ntiers=3)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    for step in (1, 2, 3):
        ckpt.save(step, expected_state(step), importance="critical")
    Replicator(store, store.policy).run_once()  # verified copies on all three tiers
    for tier in ("durable", "archive"):
        flip_byte(_rank_file(store, tier, 1), -1)  # silent damage behind fresh receipts
    apply_retention(store, store.policy, now=time.time())  # step 1 is no longer pinned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        assert_same(ckpt.load(1).state, expected_state(1))
