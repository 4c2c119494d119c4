"""The blast-radius limit: one cleanup pass may not start deleting too much of a run.

A wrong policy (``keep_last = 0`` typed for ``keep_last = 10``), a wrong clock or
a bad script calling ``gc --apply`` can each decide, correctly by their own
lights, to delete almost every checkpoint of a run. The trash delay gives time to
notice, but only if someone looks. This rule makes the pass itself stop and say
so: :func:`check_blast_radius` looks at what one pass plans and refuses, per run,

* to **start deleting** more than ``max_share`` of the run's checkpoints (those
  above ``transient``: scratch is evicted freely), or
* to start deleting any **milestone** (critical is never auto-deleted at all),

unless the operator forces it. "Start deleting" means a ``trash`` or ``purge``
action on a checkpoint none of whose copies is in the trash yet: finishing a
deletion (purging what an earlier pass trashed) was judged when it started, so
it is not counted again. Demotions delete a fast copy while verified replicas
remain: they are not deletions of the checkpoint and are never refused.

Pure: plain facts in, refusals with reasons out (no I/O, no clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mouthguard.policy.config import DEFAULT_MAX_DELETE_SHARE, check_max_share
from mouthguard.policy.deletion import CopyAction
from mouthguard.policy.facts import CheckpointFacts
from mouthguard.policy.importance import Importance

_DELETING = ("trash", "purge")


@dataclass(frozen=True)
class Doomed:
    """A checkpoint one pass would start deleting, and why the policy drops it."""

    step: int
    importance: Importance
    reason: str


@dataclass(frozen=True)
class Refusal:
    """Why the deletions of one run were withheld this pass.

    Attributes:
        run: the run.
        would_delete: every checkpoint the pass would have started deleting.
        checkpoints: how many checkpoints above transient the run has.
        why: the rule that stopped it, in words (share and limit, or the milestones).
    """

    run: str
    would_delete: tuple[Doomed, ...]
    checkpoints: int
    why: str


def check_blast_radius(
    checkpoints: Sequence[CheckpointFacts],
    planned: Iterable[tuple[CheckpointFacts, CopyAction]],
    max_share: float = DEFAULT_MAX_DELETE_SHARE,
) -> list[Refusal]:
    """The runs whose planned deletions exceed the limit (see the module doc), by run name.

    Args:
        checkpoints: every checkpoint the pass judged (the denominators).
        planned: the copy actions the pass would carry out.
        max_share: the largest share of a run's checkpoints above transient that
            one pass may start deleting (``1.0`` allows all but milestones).

    Raises:
        ValueError: ``max_share`` is not in (0, 1].
    """
    max_share = check_max_share(max_share)
    counted: dict[str, int] = {}
    for facts in checkpoints:
        if facts.importance is not Importance.TRANSIENT:
            counted[facts.run] = counted.get(facts.run, 0) + 1
    doomed: dict[str, dict[int, Doomed]] = {}
    for facts, action in planned:
        if action.action not in _DELETING or facts.importance is Importance.TRANSIENT:
            continue
        if any(c.trashed_at is not None for c in facts.copies):
            continue  # its deletion started on an earlier pass
        per_run = doomed.setdefault(facts.run, {})
        per_run.setdefault(facts.step, Doomed(facts.step, facts.importance, action.reason))
    refusals = []
    for run, by_step in sorted(doomed.items()):
        total = counted.get(run, 0)
        would = tuple(by_step[s] for s in sorted(by_step))
        milestones = [d.step for d in would if d.importance is not Importance.ROUTINE]
        why = []
        if total and len(would) / total > max_share:
            why.append(
                f"it would start deleting {len(would)} of the run's {total} checkpoints "
                f"({len(would) / total:.0%}), more than the limit of {max_share:.0%} per pass"
            )
        if milestones:
            steps = ", ".join(str(s) for s in milestones)
            why.append(f"it would start deleting milestone step(s) {steps}")
        if why:
            refusals.append(Refusal(run, would, total, "; ".join(why)))
    return refusals


__all__ = [
    "DEFAULT_MAX_DELETE_SHARE",
    "Doomed",
    "Refusal",
    "check_blast_radius",
    "check_max_share",
]
