"""Placement: where a checkpoint of a given importance must live, and whether it does.

:func:`placement_for` turns an importance and the store's tiers into a
:class:`Placement`; :func:`protection_status` compares a checkpoint's copies with
it. Both are pure and deterministic.

Rules (see :mod:`mouthguard.policy.config` for the per-level numbers):

* Saves land on the fast tier first: it is the first target, because the write
  path always commits there. The fast tier is the first tier marked
  ``is_fast``, else the first tier listed.
* Durability is the fast tier's: a save there is on stable storage when it is
  acknowledged iff that tier is ``durable`` (the local tier fsyncs), at every
  importance. The reasons say which, so ``mouthguard doctor`` reports what the
  write path does.
* Above transient only copies on *durable* tiers count as replicas: a RAM copy
  is gone after a power cut, so it protects nothing.
* Replicas are chosen greedily over the durable tiers in configured order,
  preferring a failure domain not yet used, until ``min_copies`` replicas span
  ``min_copies`` domains (or one domain when ``distinct_domains`` is off).
  ``all_durable_tiers`` (critical) targets every durable tier; the fast tier
  is left out of "every" because its copy is the recovery cache, held only
  while the checkpoint is pinned there.
* A store that cannot meet the requirement yields ``satisfiable=False`` and a
  reason naming exactly what is missing. Less is never accepted silently: the
  targets are the best effort, but such a checkpoint never reaches
  ``protected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.facts import CheckpointFacts, CopyFacts, TierFacts, plural
from mouthguard.policy.importance import Importance

ProtectionState = Literal["missing", "committed", "verified", "protected"]


@dataclass(frozen=True)
class Placement:
    """Where one importance level's checkpoints go and what protects them.

    Attributes:
        importance: the level this placement is for.
        targets: tier names to write, fast tier first, then configured order.
        required_copies: replicas needed on ``counted_tiers``.
        required_domains: distinct failure domains those replicas must span.
        distinct_domains: the level asks for distinct failure domains.
        verify: a replica counts only once read back and verified.
        legal_hold: place a legal hold on targets that support object lock.
        satisfiable: the store's tiers can meet the requirement at all.
        reasons: why each target was chosen and, when unsatisfiable, what is
            missing (those entries start with ``unsatisfiable:``).
        missing: only the ``unsatisfiable:`` reasons (empty iff ``satisfiable``),
            for callers that report shortfalls.
        counted_tiers: tiers whose copies count as replicas (durable tiers above
            transient; the fast tier for transient).
        every_tier: tiers that must each hold a replica (critical: every durable
            tier except the fast tiers).
        fast_tier: the fast tier's name (``None`` only when no tier exists).
        tiers: the store's tiers as given, for the deletion rules.
    """

    importance: Importance
    targets: tuple[str, ...]
    required_copies: int
    required_domains: int
    distinct_domains: bool
    verify: bool
    legal_hold: bool
    satisfiable: bool
    reasons: tuple[str, ...]
    missing: tuple[str, ...] = ()
    counted_tiers: tuple[str, ...] = ()
    every_tier: tuple[str, ...] = ()
    fast_tier: str | None = None
    tiers: tuple[TierFacts, ...] = ()

    def tier(self, name: str) -> TierFacts | None:
        """The facts of tier ``name``, or ``None`` when it is not configured."""
        return next((t for t in self.tiers if t.name == name), None)


@dataclass(frozen=True)
class Protection:
    """How far a checkpoint's copies meet its placement.

    Attributes:
        state: ``"protected"`` (every requirement met), ``"verified"`` (some copy
            read back and matched, requirement not met), ``"committed"`` (copies
            exist, none verified) or ``"missing"`` (no live copy at all).
        met: requirements that hold, as sentences.
        missing: requirements that do not, as sentences (empty iff protected).
    """

    state: ProtectionState
    met: tuple[str, ...]
    missing: tuple[str, ...]


def ordered_copies(copies: Sequence[CopyFacts], placement: Placement) -> list[CopyFacts]:
    """``copies`` in configured tier order, unconfigured tiers last by name.

    Every list of tiers in a decision or reason follows this order, so the
    order in which the facts were gathered never shows in the output.
    """
    order = {t.name: i for i, t in enumerate(placement.tiers)}
    return sorted(copies, key=lambda c: (order.get(c.tier, len(order)), c.tier))


def fast_tier_of(tiers: Sequence[TierFacts]) -> TierFacts | None:
    """The first tier marked fast, else the first tier listed, else ``None``."""
    return next((t for t in tiers if t.is_fast), tiers[0] if tiers else None)


def placement_for(
    importance: Importance, tiers: Sequence[TierFacts], config: PolicyConfig
) -> Placement:
    """Decide where checkpoints of ``importance`` go on a store with ``tiers``.

    Args:
        importance: the checkpoint's level.
        tiers: the store's tiers in configured order (names unique).
        config: the policy configuration.

    Returns:
        The placement; ``satisfiable`` is false (with a reason saying what is
        missing) when the tiers cannot meet the level's requirement.

    Raises:
        ValueError: two tiers share a name.
    """
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"tier names must be unique, got {names}")
    level = config.level(importance)
    fast = fast_tier_of(tiers)
    if fast is None:
        return Placement(
            importance=importance,
            targets=(),
            required_copies=level.min_copies,
            required_domains=level.min_copies if level.distinct_domains else 1,
            distinct_domains=level.distinct_domains,
            verify=level.verify_before_counting,
            legal_hold=level.legal_hold,
            satisfiable=False,
            reasons=("unsatisfiable: the store has no tiers",),
            missing=("unsatisfiable: the store has no tiers",),
        )
    if level.fast_only:
        return Placement(
            importance=importance,
            targets=(fast.name,),
            required_copies=1,
            required_domains=1,
            distinct_domains=False,
            verify=level.verify_before_counting,
            legal_hold=False,
            satisfiable=True,
            reasons=(
                f"{importance.value}: one copy, on the fast tier ({fast.name}) only; evicted first",
                _durability(fast),
            ),
            counted_tiers=(fast.name,),
            fast_tier=fast.name,
            tiers=tuple(tiers),
        )
    return _replicated(importance, tiers, fast, config)


def _replicated(
    importance: Importance, tiers: Sequence[TierFacts], fast: TierFacts, config: PolicyConfig
) -> Placement:
    level = config.level(importance)
    durable = [t for t in tiers if t.durable]
    every = level.all_durable_tiers
    # "Every durable tier" leaves out the fast tiers: the fast copy is the recovery
    # cache, held only while the checkpoint is pinned there (critical is not
    # demoted off fast *while it is the newest critical*), so it cannot be a copy
    # the checkpoint is owed forever.
    home = [t for t in durable if not (t.is_fast or t is fast)] if every else []
    required = max(level.min_copies, len(home)) if every else level.min_copies
    needed_domains = level.min_copies if level.distinct_domains else 1
    reasons = [_requirement(importance.value, required, needed_domains, every)]

    targets: list[TierFacts] = [fast]
    replicas: list[TierFacts] = []
    how = "durable, counts as a replica" if fast.durable else "not durable, not a replica"
    reasons.append(f"{fast.name}: fast tier, saves land here first ({how})")
    if fast.durable:
        replicas.append(fast)
    for tier in home:
        replicas.append(tier)
        reasons.append(f"{tier.name}: every durable tier off the fast tier holds a copy")

    def domains() -> set[str]:
        return {t.domain for t in replicas}

    # First pass: new failure domains only, so copies spread before they pile up.
    for tier in durable:
        if len(replicas) >= required and len(domains()) >= needed_domains:
            break
        if tier not in replicas and tier.domain not in domains():
            replicas.append(tier)
            reasons.append(f"{tier.name}: durable tier in a new failure domain ({tier.domain})")
    # Second pass: reach the count. It cannot add a domain: the first pass already
    # took one tier of each.
    for tier in durable:
        if len(replicas) >= required:
            break
        if tier not in replicas:
            replicas.append(tier)
            reasons.append(f"{tier.name}: durable tier, failure domain {tier.domain} already used")
    targets.extend(t for t in tiers if t in replicas and t not in targets)

    missing = _missing(importance.value, durable, required, needed_domains)
    if level.verify_before_counting:
        reasons.append("a replica counts once it is read back and verified")
    reasons.append(_durability(fast))
    if level.legal_hold:
        locking = [t.name for t in targets if t.object_lock]
        reasons.append(
            f"legal hold on {', '.join(locking)} (object lock)"
            if locking
            else "legal hold: no target supports object lock; mouthguard's own hold applies"
        )
    return Placement(
        importance=importance,
        targets=tuple(t.name for t in targets),
        required_copies=required,
        required_domains=needed_domains,
        distinct_domains=level.distinct_domains,
        verify=level.verify_before_counting,
        legal_hold=level.legal_hold,
        satisfiable=not missing,
        reasons=(*reasons, *missing),
        missing=tuple(missing),
        counted_tiers=tuple(t.name for t in durable),
        every_tier=tuple(t.name for t in home),
        fast_tier=fast.name,
        tiers=tuple(tiers),
    )


def _durability(fast: TierFacts) -> str:
    """What acknowledging a save means on ``fast``: the tier decides, not the level."""
    if fast.durable:
        return f"a save is on stable storage before it is acknowledged ({fast.name} is durable)"
    return f"a save is not on stable storage when acknowledged ({fast.name} is not durable)"


def _requirement(level: str, required: int, domains: int, every: bool) -> str:
    spread = f" in {domains} distinct failure domains" if domains > 1 else ""
    every_text = ", one on every durable tier off the fast tier" if every else ""
    rf2 = " (RF2 minimum)" if required == 2 and domains == 2 and not every else ""
    return f"{level}: {required} replicas on durable tiers{spread}{every_text}{rf2}"


def _missing(level: str, durable: Sequence[TierFacts], required: int, domains: int) -> list[str]:
    missing = []
    names = ", ".join(t.name for t in durable) or "none"
    if len(durable) < required:
        missing.append(
            f"unsatisfiable: {level} needs {required} replicas on durable tiers "
            f"but the store has {plural(len(durable), 'durable tier')} ({names})"
        )
    spread = sorted({t.domain for t in durable})
    if len(spread) < domains:
        missing.append(
            f"unsatisfiable: {level} needs replicas in {domains} distinct failure domains "
            f"but the durable tiers span {len(spread)} ({', '.join(spread) or 'none'}): "
            "add a durable tier in another failure domain"
        )
    return missing


def protection_status(checkpoint: CheckpointFacts, placement: Placement) -> Protection:
    """Compare ``checkpoint``'s live (untrashed) copies with ``placement``.

    A checkpoint is ``protected`` when it is not known to be invalid,
    ``required_copies`` replicas exist on counted tiers, spanning
    ``required_domains`` failure domains, each verified when the placement
    requires verification and none with a damage report, and every tier in
    ``every_tier`` holds one.
    Anything less is ``verified`` (some live copy verified), ``committed``
    (live copies, none verified) or ``missing`` (no live copy).
    """
    live = [c for c in ordered_copies(checkpoint.copies, placement) if not c.trashed]
    if not live:
        return Protection("missing", (), ("no live copy: none committed, or every copy trashed",))
    counted_tiers = set(placement.counted_tiers)
    # A copy a reader reported damaged protects nothing until it reads back intact,
    # whatever receipt sits beside the report.
    eligible = [c for c in live if c.tier in counted_tiers and not c.damage_reported]
    replicas = [c for c in eligible if c.verified or not placement.verify]
    kind = "verified replica" if placement.verify else "replica"
    listed = ", ".join(f"{c.tier}" for c in replicas) or "none"
    required = placement.required_copies
    met: list[str] = []
    missing: list[str] = []
    if len(replicas) >= required:
        met.append(f"{plural(len(replicas), kind)} (required {required}): {listed}")
    else:
        unverified = [c.tier for c in eligible if not c.verified]
        # Name the copies that would count once verified: that is the job to run.
        pending = (
            f" (not verified yet: {', '.join(unverified)})"
            if placement.verify and unverified
            else ""
        )
        reported = [c.tier for c in live if c.damage_reported]
        if reported:
            pending += f" (damage reported, not counted: {', '.join(reported)})"
        missing.append(f"only {len(replicas)} of {required} required {kind}s: {listed}{pending}")
    if placement.required_domains > 1:
        domains = sorted({c.domain for c in replicas})
        spread = f"{plural(len(domains), 'failure domain')} ({', '.join(domains) or 'none'})"
        if len(domains) >= placement.required_domains:
            met.append(f"{kind}s span {spread}, required {placement.required_domains}")
        else:
            missing.append(f"{kind}s span only {spread}, required {placement.required_domains}")
    if checkpoint.suspect:
        # Intact copies of a state a resume skips protect no resume, however many.
        missing.append(f"suspect: {checkpoint.suspect} (a resume skips it)")
    elif checkpoint.known_invalid:
        # Copies of a checkpoint that cannot be loaded protect nothing, however many.
        missing.append("the checkpoint failed verification: its copies cannot be loaded")
    holders = {c.tier for c in replicas}
    missing.extend(
        f"no {kind} on durable tier {name} "
        f"(every durable tier off the fast tier holds a {placement.importance.value} copy)"
        for name in placement.every_tier
        if name not in holders
    )
    if missing:
        state: ProtectionState = "verified" if any(c.verified for c in live) else "committed"
    else:
        state = "protected"
    return Protection(state, tuple(met), tuple(missing))
