"""The rounds of a chaos run through faulty tiers, and the judge through clean ones.

The invariants it checks are listed in the package docstring, :mod:`mouthguard.chaos`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import xxhash

from mouthguard.chaos.report import ChaosReport
from mouthguard.chaos.state import chaos_state, same_state
from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import TRAIL_DIR
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import CheckpointInfo
from mouthguard.checkpoint.sidecars import CopyRef, read_sidecars
from mouthguard.checkpoint.store import Store
from mouthguard.errors import CheckpointFallbackWarning, MouthguardError
from mouthguard.format.manifest import MANIFEST_NAME, parse_manifest
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier, unwrap

log = logging.getLogger(__name__)

#: The mix ``mouthguard chaos`` and ``reliability/chaos.py`` inject: every kind, at
#: rates per tier call (a round makes a few hundred) that let most passes finish.
DEFAULT_FAULTS = (
    "error=0.005,enospc=0.03,torn=0.01,short=0.01,flip=0.005,fsync=0.03,delay=0.02:0.0005"
)

#: Importance levels drawn for the saves, with their weights.
_LEVELS = (
    (Importance.ROUTINE, 0.65),
    (Importance.TRANSIENT, 0.15),
    (Importance.MILESTONE, 0.12),
    (Importance.CRITICAL, 0.08),
)
_SILENT = ("torn", "short")
_T = TypeVar("_T")


def chaos_policy(policy: PolicyConfig) -> PolicyConfig:
    """``policy`` with every trash delay 0, so retention's purges happen during the run."""
    levels = {
        imp: dataclasses.replace(lvl, trash_delay_seconds=0.0) for imp, lvl in policy.levels.items()
    }
    return dataclasses.replace(policy, trash_delay_seconds=0.0, levels=levels)


def scratch_run_name(now: float | None = None) -> str:
    """A fresh run name for a chaos run: ``chaos-YYYYmmdd-HHMMSS-<random>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"chaos-{stamp}-{random.randbytes(3).hex()}"  # noqa: S311 - a name, not a secret


@dataclass
class _Ledger:
    """What the run knows about its own steps (the judge's memory)."""

    acknowledged: dict[int, Importance] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    born_corrupt: set[int] = field(default_factory=set)
    purged: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    corrupt_seen: set[tuple[str, int]] = field(default_factory=set)
    failed_visible: set[int] = field(default_factory=set)
    unloadable: set[int] = field(default_factory=set)
    set_aside_seen: set[tuple[str, str]] = field(default_factory=set)
    receipts_judged: set[tuple[str, int, str]] = field(default_factory=set)


class _Chaos:
    """One chaos run's state; :func:`run_chaos` is its public face."""

    def __init__(self, store: Store, run: str, plan: FaultPlan, seed: int) -> None:
        self.run = catalog.validate_run(run)
        self.plan = plan
        self.rng = random.Random(seed)  # noqa: S311 - reproducible choices, not secrets
        policy = chaos_policy(store.policy)
        clean = [unwrap(t) for t in store.tiers]
        self.faulty = [
            FaultyTier(
                t, plan, seed=seed * 7919 + i, confine_to=f"{self.run}/", exempt=TRAIL_DIR + "/"
            )
            for i, t in enumerate(clean)
        ]
        self.faulty_store = Store(self.faulty, source=store.source, policy=policy)
        self.clean_store = Store(clean, source=store.source, policy=policy)
        self.ckpt = Checkpointer(self.faulty_store, self.run, background=False)
        self.judge = Checkpointer(self.clean_store, self.run, background=False)
        self.ledger = _Ledger()
        self.report = ChaosReport(run=self.run, plan=plan.spec(), seed=seed)
        self._round_bad = False
        self._round_lost: set[int] = set()

    # --- bookkeeping ---------------------------------------------------------

    def _injected(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for tier in self.faulty:
            total.update(tier.injected)
        return total

    def _violation(self, what: str, message: str) -> None:
        setattr(self.report, what, getattr(self.report, what) + 1)
        self.report.failures.append(f"round {self.report.rounds + 1}: {message}")
        log.error("chaos %s: %s", what, message)
        self._round_bad = True

    def _guard(self, what: str, action: Callable[[], _T], errors: Counter[str]) -> _T | None:
        """Run one action: a MouthguardError is an expected outcome, anything else a crash."""
        try:
            return action()
        except MouthguardError as exc:
            errors[f"{what}: {type(exc).__name__}"] += 1
            return None
        except Exception as exc:  # noqa: BLE001 - a crash is what this harness looks for
            self._violation("crashes", f"{what} crashed: {type(exc).__name__}: {exc}")
            return None

    def _silent_events_of(self, step: int, since: int) -> bool:
        """Whether a torn or short write hit ``step`` on the fast tier after ``since``."""
        fast = self.faulty[0]
        marker = f"{self.run}/{catalog.step_dir(step)}"
        return any(e.kind in _SILENT and e.key.startswith(marker) for e in fast.events[since:])

    # --- one round -----------------------------------------------------------

    def _save(self, step: int, *, asynchronous: bool) -> None:
        level = self.rng.choices([lvl for lvl, _ in _LEVELS], [w for _, w in _LEVELS])[0]
        state = chaos_state(step)
        since = len(self.faulty[0].events)
        self.report.saves += 1
        what = "save_async" if asynchronous else "save"

        def save() -> CheckpointInfo:
            if asynchronous:
                return self.ckpt.save_async(step, state, level).result()
            return self.ckpt.save(step, state, level)

        if self._guard(what, save, self.report.save_errors) is None:
            self.ledger.failed.add(step)
            return
        self.report.acknowledged += 1
        self.ledger.acknowledged[step] = level
        if self._silent_events_of(step, since):
            self.ledger.born_corrupt.add(step)

    def _load(self, step: int | None) -> None:
        self.report.loads += 1
        loaded = self._guard(
            "load" if step is None else "load(step)",
            lambda: self.ckpt.load(step),
            self.report.load_errors,
        )
        if loaded is None:
            return
        got_step = loaded.step
        if loaded.rejected:
            self.report.load_fallbacks += 1
        if not same_state(loaded.state, chaos_state(got_step)):
            self._violation(
                "accepted_corrupt",
                f"load({step}) through the faulty tiers returned wrong bytes for step {got_step}",
            )

    def _passes(self) -> None:
        errors = self.report.pass_errors
        replicator = Replicator(self.faulty_store, self.faulty_store.policy)
        self._guard("replicate", lambda: replicator.run_once([self.run]), errors)
        retention = self._guard(
            "retention",
            lambda: apply_retention(self.faulty_store, runs=[self.run]),
            errors,
        )
        if retention is not None:
            for applied in retention.actions:
                if applied.action.action == "purge":
                    self.ledger.purged.add(applied.step)
        self._guard("gc", lambda: self.ckpt.collect_garbage(grace_seconds=0.0), errors)

    def _check(self) -> None:
        """The invariants, judged through the unwrapped tiers."""
        loadable: set[int] = set()
        for step in self.judge.steps():
            try:
                loaded = self.judge.load(step)
            except MouthguardError:
                self.ledger.unloadable.add(step)
                self.report.listed_damaged = len(self.ledger.unloadable)
                continue
            if same_state(loaded.state, chaos_state(step)):
                loadable.add(step)
                if step in self.ledger.failed and step not in self.ledger.failed_visible:
                    self.ledger.failed_visible.add(step)
                    self.report.failed_but_visible += 1
            elif (loaded.tier, step) not in self.ledger.corrupt_seen:
                self.ledger.corrupt_seen.add((loaded.tier, step))
                self._violation(
                    "accepted_corrupt",
                    f"step {step} on tier {loaded.tier} loads with wrong bytes",
                )
        for step, level in sorted(self.ledger.acknowledged.items()):
            if step in loadable or step in self.ledger.lost:
                continue
            self.ledger.lost.add(step)
            if step in self.ledger.purged:
                self.report.deleted_by_policy += 1
            elif step in self.ledger.born_corrupt:
                self.report.lost_to_storage += 1
            else:
                where = self._whereabouts(step)
                self._violation(
                    "lost_acknowledged",
                    f"acknowledged {level.value} step {step} no longer loads ({where})",
                )
        self._check_set_aside()
        self._check_receipts()
        outside = sum(len(t.outside) for t in self.faulty)
        if outside > self.report.writes_outside:
            self._violation("writes_outside", f"{outside} writes outside {self.run}/ refused")
            self.report.writes_outside = outside

    def _check_set_aside(self) -> None:
        """Every copy set aside since the last round fails verification (unwrapped tier)."""
        for tier in self.clean_store.tiers:
            for name in tier.list_dirs(f"{self.run}/"):
                if ".rejected-" not in name or (tier.name, name) in self.ledger.set_aside_seen:
                    continue
                self.ledger.set_aside_seen.add((tier.name, name))
                self.report.set_aside += 1
                if _intact(tier, f"{self.run}/{name.rstrip('/')}/"):
                    self._violation(
                        "false_damage",
                        f"{name} on tier {tier.name} was set aside but verifies intact",
                    )

    def _check_receipts(self) -> None:
        """Every receipt vouches for bytes that verify now (unwrapped tier)."""
        for step in self.judge.steps():
            for tier in self.clean_store.tiers:
                ref = CopyRef(tier, self.run, step)
                if not tier.exists(catalog.manifest_key(self.run, step)):
                    continue
                side = read_sidecars(ref)
                if side.verified_at is None:
                    continue
                judged = (tier.name, step, side.verified_at.isoformat())
                if judged in self.ledger.receipts_judged:
                    continue  # the same receipt on the same (immutable) bytes
                self.ledger.receipts_judged.add(judged)
                self.report.receipts_checked += 1
                if not _intact(tier, ref.prefix):
                    self._violation(
                        "false_receipt",
                        f"step {step} on tier {tier.name} has a receipt but fails verification",
                    )

    def _whereabouts(self, step: int) -> str:
        """Where a lost step's bytes went, for the failure message."""
        found = []
        for tier in self.clean_store.tiers:
            names = [
                d for d in tier.list_dirs(f"{self.run}/") if d.startswith(catalog.step_dir(step))
            ]
            found += [f"{tier.name}:{n}" for n in names]
        return "directories: " + (", ".join(found) or "none")

    def round(self) -> None:
        """One round: two saves, two loads, the background jobs, then the judgement."""
        before = self.report.cases
        self._round_bad = False
        number = self.report.rounds
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointFallbackWarning)
            self._save(2 * number + 1, asynchronous=False)
            self._save(2 * number + 2, asynchronous=True)
            self._load(None)
            alive = sorted(set(self.ledger.acknowledged) - self.ledger.lost)
            if alive:
                self._load(self.rng.choice(alive))
            self._passes()
            self.report.injected = self._injected()
            self._check()
        self.report.rounds += 1
        if not self._round_bad:
            self.report.rounds_ok += 1
            self.report.survived += self.report.cases - before

    def close(self) -> None:
        self.ckpt.close()
        self.judge.close()


def _intact(tier: Tier, prefix: str) -> bool:
    """Whether the copy under ``prefix`` matches its own manifest, byte for byte.

    Hashed here with ``xxhash`` and ``hashlib`` directly, not through the reader
    the store itself verifies with: a judge that shared the code under test
    would share its bugs.
    """
    try:
        manifest = parse_manifest(tier.get(prefix + MANIFEST_NAME))
        for record in manifest.files:
            data = tier.get(prefix + record.name)
            if len(data) != record.size:
                return False
            if record.checksum != "xxh3-128:" + xxhash.xxh3_128_hexdigest(data):
                return False
            if record.sha256 and record.sha256 != "sha256:" + hashlib.sha256(data).hexdigest():
                return False
    except MouthguardError:
        return False
    return True


def run_chaos(
    store: Store,
    *,
    rounds: int,
    plan: FaultPlan | None = None,
    seed: int = 0,
    run: str | None = None,
    max_seconds: float | None = None,
    on_round: Callable[[ChaosReport], None] | None = None,
) -> ChaosReport:
    """Run up to ``rounds`` chaos rounds on a scratch run of ``store`` (see the module doc).

    Args:
        store: the store whose tiers are exercised (only ``<run>/`` is written).
        rounds: the number of rounds (each saves two steps).
        plan: the faults (default :data:`DEFAULT_FAULTS`).
        seed: seeds the faults and the run's choices.
        run: the scratch run's name (default: :func:`scratch_run_name`). It should
            be new: the run's steps start at 1.
        max_seconds: stop after the round in progress once this much time passed.
        on_round: called with the report after every round (progress).

    The scratch run is left on the store; :func:`remove_run` removes it.
    """
    plan = plan if plan is not None else FaultPlan.parse(DEFAULT_FAULTS)
    chaos = _Chaos(store, run or scratch_run_name(), plan, seed)
    started = time.monotonic()
    try:
        for _ in range(rounds):
            chaos.round()
            chaos.report.seconds = time.monotonic() - started
            if on_round is not None:
                on_round(chaos.report)
            if max_seconds is not None and chaos.report.seconds >= max_seconds:
                break
    finally:
        chaos.close()
        chaos.report.seconds = time.monotonic() - started
    return chaos.report


def remove_run(store: Store, run: str) -> int:
    """Delete every object of ``run`` (and the tiers' own debris) from every tier."""
    prefix = f"{catalog.validate_run(run)}/"
    removed = 0
    for tier in store.tiers:
        inner: Tier = unwrap(tier)
        removed += inner.delete_prefix(prefix)
        inner.collect_incomplete(prefix, 0.0)
    return removed
