"""Retention: which checkpoints to keep, each decision with every reason (restic ``forget``).

A checkpoint is kept if ANY rule keeps it, and its decision lists every rule
that does, in this fixed order:

1. ``held``: a hold blocks deletion, whatever else is true.
2. ``critical``: never auto-deleted (valid or not: a human decides).
3. Recovery points, per run, whatever the level:

   * the newest checkpoint not known to be invalid ("newest valid checkpoint"
     when it is proven valid, "... not known to be invalid (unchecked)" when
     it was never checked) -- a newer *invalid* checkpoint never displaces it;
   * when that one is unchecked, also the newest *proven* valid checkpoint
     (:attr:`CheckpointFacts.proven_valid`: marked valid, or a verified copy),
     so an unchecked save that later turns out corrupt still has a fallback;
   * the newest checkpoint whose semantic check passed on a resume
     (:attr:`CheckpointFacts.checked`), when it is not the newest: bytes that
     verify can still hold a state that trains into NaN, so the last state a
     resume proved sound stays until a newer one is proved.

4. Keep-last, per run and per level: the last ``keep_last`` checkpoints of that
   level not known to be invalid (routine counts routine saves, transient its
   own, milestone its own; ``None`` keeps all of them).
5. Best-K, per run: the ``best_k`` best by ``best_metric``. Checkpoints without
   the metric (or with NaN), invalid ones and transient ones take no part: a
   corrupt best cannot be resumed from, and scratch is evicted first. Ties
   go to the newer step.
6. Keep-within: every checkpoint above transient not known to be invalid and
   created less than ``keep_within_seconds`` before ``now`` (or after it).

Invalid checkpoints (``valid=False``) are kept only by rules 1 and 2: they are
never counted by keep-last or best-K, so a corrupt save never pushes a good one
out. Unchecked checkpoints (``valid=None``) count as valid for rules 4-6: a
fresh save is unchecked and must not be dropped for that. Checkpoints their
trainer gave up (``released``: Lightning's top-k dropped them) take no part in
rules 4-6 either: only rules 1-3 keep them, so the store holds what the trainer
holds.

Pinning on the fast tier is decided here too, because it needs the whole run:
the ``fast_keep_newest`` newest kept, not-invalid checkpoints above transient,
and the newest not-invalid critical checkpoint of each run, are pinned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise

from mouthguard.policy.config import PolicyConfig
from mouthguard.policy.facts import (
    CheckpointFacts,
    check_time,
    format_duration,
    format_number,
)
from mouthguard.policy.importance import Importance


@dataclass(frozen=True)
class RetentionDecision:
    """Whether one checkpoint is kept, and why.

    Attributes:
        run: run name.
        step: step.
        keep: some rule keeps it.
        reasons: every rule that keeps it (``keep``), or why none does.
        newest_valid: it is a recovery point of its run (rule 3); the deletion
            rules never delete it.
        pin_reasons: why its copy must stay on the fast tier (empty: not pinned).
    """

    run: str
    step: int
    keep: bool
    reasons: tuple[str, ...]
    newest_valid: bool = False
    pin_reasons: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        """``(run, step)``."""
        return (self.run, self.step)

    @property
    def pinned_on_fast(self) -> bool:
        """The fast-tier copy must not be demoted."""
        return bool(self.pin_reasons)


def decide_retention(
    checkpoints: Sequence[CheckpointFacts], config: PolicyConfig, now: float
) -> list[RetentionDecision]:
    """Decide, for every checkpoint, whether retention keeps it.

    Args:
        checkpoints: every checkpoint of the store (any order, any runs).
        config: the policy configuration.
        now: the current unix time (only rule 6 reads it).

    Returns:
        One decision per input checkpoint, ordered by ``(run, step)``.

    Raises:
        ValueError: two checkpoints share ``(run, step)``, or ``now`` is not finite.
    """
    now = check_time("now", now)
    ordered = sorted(checkpoints, key=lambda c: c.key)
    for before, after in pairwise(ordered):
        if before.key == after.key:
            raise ValueError(f"checkpoint {after.label} appears twice")
    decisions: list[RetentionDecision] = []
    for run, group in groupby(ordered, key=lambda c: c.run):
        decisions.extend(_decide_run(run, list(group), config, now))
    return decisions


#: (step, reason) pairs produced by one rule, in the rule's own order.
_Reasons = list[tuple[int, str]]


def _decide_run(
    run: str, ckpts: list[CheckpointFacts], config: PolicyConfig, now: float
) -> list[RetentionDecision]:
    """Apply the rules to one run's checkpoints (sorted by step)."""
    # Newest first: every "the last N" rule counts from the newest end.
    candidates = [c for c in reversed(ckpts) if not c.known_invalid]
    recovery = _recovery_points(run, candidates)
    # What its trainer gave up is kept only as a recovery point (or by rules 1-2).
    wanted = [c for c in candidates if not c.released]
    kept_by, dropped_by = _keep_last(run, wanted, config)
    keep: dict[int, list[str]] = {c.step: [] for c in ckpts}
    for rule in (
        _guards(ckpts, config),
        list(recovery.items()),
        kept_by,
        _best(wanted, config),
        _within(wanted, config, now),
    ):
        for step, reason in rule:
            keep[step].append(reason)
    decisions = []
    for c in ckpts:
        reasons = keep[c.step] or [
            f"{c.invalid_because}; only a hold or critical importance keeps it"
            if c.known_invalid
            else _RELEASED
            if c.released
            else dropped_by[c.step]
        ]
        decisions.append(
            RetentionDecision(
                run=run,
                step=c.step,
                keep=bool(keep[c.step]),
                reasons=tuple(reasons),
                newest_valid=c.step in recovery,
            )
        )
    return _pin(run, ckpts, decisions, config)


_RELEASED = (
    "released by its trainer (e.g. Lightning's top-k dropped it): only a hold, critical "
    "importance or being a recovery point keeps it"
)


def _guards(ckpts: list[CheckpointFacts], config: PolicyConfig) -> _Reasons:
    """Rules 1 and 2: holds and critical keep a checkpoint whatever its validity."""
    reasons: _Reasons = []
    for c in ckpts:
        if c.held:
            reasons.append((c.step, "held: a hold blocks deletion"))
        if config.level(c.importance).never_auto_delete:
            reasons.append((c.step, f"{c.importance.value}: never auto-deleted"))
    return reasons


def _keep_last(
    run: str, candidates: list[CheckpointFacts], config: PolicyConfig
) -> tuple[_Reasons, dict[int, str]]:
    """Rule 4, per level; also the reason each candidate it does not keep is dropped."""
    kept: _Reasons = []
    dropped: dict[int, str] = {}
    for importance in Importance:
        level = config.level(importance)
        if level.never_auto_delete:
            continue
        limit = level.keep_last
        own = [c for c in candidates if c.importance is importance]
        for index, c in enumerate(own):
            if limit is None:
                kept.append((c.step, f"{importance.value}: every valid {importance.value} is kept"))
            elif index < limit:
                kept.append((c.step, f"{importance.value}: {_last(limit, importance, run)}"))
            else:
                dropped[c.step] = f"{importance.value}: {_beyond(limit, importance, run)}"
    return kept, dropped


def _within(candidates: list[CheckpointFacts], config: PolicyConfig, now: float) -> _Reasons:
    """Rule 6: young checkpoints above transient (created after ``now`` counts as young)."""
    window = config.keep_within_seconds
    if window is None:
        return []
    return [
        (
            c.step,
            f"created within {format_duration(window)} of now "
            f"({format_duration(now - c.created)} old)",
        )
        for c in candidates
        if c.importance is not Importance.TRANSIENT and now - c.created < window
    ]


def _recovery_points(run: str, candidates: list[CheckpointFacts]) -> dict[int, str]:
    """Rule 3: the newest not-invalid checkpoint, the newest proven valid, the newest checked."""
    if not candidates:
        return {}
    first = candidates[0]
    if first.proven_valid:
        points = {first.step: f"newest valid checkpoint of run {run}"}
    else:
        points = {first.step: f"newest checkpoint of run {run} not known to be invalid (unchecked)"}
        proven = next((c for c in candidates if c.proven_valid), None)
        if proven is not None:
            points[proven.step] = (
                f"newest verified-valid checkpoint of run {run} (newer ones are unchecked)"
            )
    checked = next((c for c in candidates if c.checked), None)
    if checked is not None and checked.step not in points:
        points[checked.step] = (
            f"newest checkpoint of run {run} whose state passed a check on resume "
            "(newer ones were not checked)"
        )
    return points


def _best(candidates: list[CheckpointFacts], config: PolicyConfig) -> _Reasons:
    """Rule 5: the ``best_k`` best by ``best_metric``, newer step winning ties."""
    metric = config.best_metric
    if metric is None or config.best_k == 0:
        return []
    scored = [
        (c.metrics[metric], c.step)
        for c in candidates
        if c.importance is not Importance.TRANSIENT
        and metric in c.metrics
        and not math.isnan(c.metrics[metric])
    ]
    sign = 1.0 if config.best_mode == "min" else -1.0
    scored.sort(key=lambda pair: (sign * pair[0], -pair[1]))
    return [
        (
            step,
            f"best {config.best_k} by {metric} ({config.best_mode}): "
            f"{metric}={format_number(value)}, rank {rank}",
        )
        for rank, (value, step) in enumerate(scored[: config.best_k], start=1)
    ]


def _pin(
    run: str,
    ckpts: list[CheckpointFacts],
    decisions: list[RetentionDecision],
    config: PolicyConfig,
) -> list[RetentionDecision]:
    """Mark the kept checkpoints whose fast-tier copy must stay (see module doc)."""
    pins: dict[int, list[str]] = {}
    kept = [
        c
        for c, d in zip(reversed(ckpts), reversed(decisions), strict=True)
        if d.keep and not c.known_invalid and c.importance is not Importance.TRANSIENT
    ]
    n = config.fast_keep_newest
    for c in kept[:n]:
        which = (
            f"the newest valid checkpoint of run {run}"
            if n == 1
            else f"one of the {n} newest valid checkpoints of run {run}"
        )
        pins.setdefault(c.step, []).append(f"pinned on fast: {which}")
    critical = next((c for c in kept if c.importance is Importance.CRITICAL), None)
    if critical is not None:
        pins.setdefault(critical.step, []).append(
            f"pinned on fast: newest critical checkpoint of run {run}"
        )
    return [
        RetentionDecision(
            run=d.run,
            step=d.step,
            keep=d.keep,
            reasons=d.reasons,
            newest_valid=d.newest_valid,
            pin_reasons=tuple(pins.get(d.step, ())),
        )
        for d in decisions
    ]


def _last(limit: int, importance: Importance, run: str) -> str:
    if limit == 1:
        return f"the last valid {importance.value} checkpoint of run {run}"
    return f"one of the last {limit} valid {importance.value} checkpoints of run {run}"


def _beyond(limit: int, importance: Importance, run: str) -> str:
    if limit == 0:
        return f"keep_last is 0: no {importance.value} checkpoint is kept by count"
    return f"older than {_last(limit, importance, run).removeprefix('one of ')}"
