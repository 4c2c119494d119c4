"""Semantic checks of a checkpoint's state: bytes can be intact while the state is not.

A *check* is any callable that takes a :class:`CheckInput` (the step, the
state, the reference values stored with it) and returns ``None`` when the state
is fine, or a non-empty string saying why it is not. A check that raises is a
bug in the check, not a verdict on the checkpoint: its exception propagates
unchanged. Multi-rank, the exception is gathered like a verdict
(:func:`agreed_verdicts`), so no rank waits for the one that raised: that rank
raises its own exception, every other rank a
:class:`~mouthguard.errors.RankFailedError` naming it -- at once, not after the
collective timeout. Built-in checks are in :mod:`mouthguard.checks`.

Where verdicts are kept (no database: facts live next to the copies):

* a load whose check fails marks the checkpoint *suspect* on every copy (the
  ``sidecar.suspect.json`` fact, with the reason), and one whose check passes
  records that it passed (``sidecar.checked.json``);
* a save refused by its guard is committed as ``transient`` with the reason in
  its manifest's reference values under :data:`SUSPECT_KEY`: the verdict is
  written in the same atomic commit as the bytes, so no crash can leave the
  checkpoint looking sound.

A suspect checkpoint is known to be invalid (``CheckpointFacts.valid=False``):
a resume that falls back skips it, and retention keeps it only for a hold or
critical importance. The newest checkpoint whose check passed is a recovery
point retention keeps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeGuard

from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.errors import RankFailedError, SuspectStateWarning
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance

#: The reference key under which a save refused by its guard records why.
SUSPECT_KEY = "mouthguard.suspect"


@dataclass(frozen=True)
class CheckInput:
    """What a check looks at.

    Attributes:
        step: the checkpoint's step.
        state: the state (loaded, or about to be saved).
        reference: the reference values stored with it (``save(reference=...)``);
            empty when none were stored.
    """

    step: int
    state: object
    reference: Mapping[str, JsonValue] = field(default_factory=dict)


#: A check: ``None`` when the state is fine, else why it is not.
Check = Callable[[CheckInput], "str | None"]


def run_check(check: Check, subject: CheckInput) -> str | None:
    """Run ``check``; return the failure's reason, or None when it passed.

    Raises:
        TypeError: the check returned something other than None or a non-empty str.
    """
    verdict = check(subject)
    if verdict is None:
        return None
    if not isinstance(verdict, str) or not verdict:
        raise TypeError(f"a check must return None (passed) or a non-empty reason, got {verdict!r}")
    return verdict


def agreed_verdicts(check: Check, subject: CheckInput, ranks: RankGroup) -> list[str]:
    """Every rank's verdict on its own part, indexed by rank ("" = passed): a collective.

    A check that raises on some rank is gathered too, as what it raised, so every
    rank leaves the collective together.

    Raises:
        Exception: what this rank's check raised (unchanged).
        RankFailedError: another rank's check raised; the message names the rank
            and its exception.
        TypeError: this rank's check returned neither None nor a reason.
    """
    error: Exception | None = None
    mine: JsonValue
    try:
        mine = run_check(check, subject) or ""
    except Exception as exc:  # noqa: BLE001 - a bug in the check: every rank must hear of it
        error = exc
        mine = {_RAISED: f"{type(exc).__name__}: {exc}"}
    gathered = ranks.all_gather(mine)
    if error is not None:
        raise error
    raised = [(rank, str(v.get(_RAISED))) for rank, v in enumerate(gathered) if isinstance(v, dict)]
    if raised:
        where = "; ".join(f"rank {rank}: {why}" for rank, why in raised)
        raise RankFailedError(
            f"step {subject.step}: the check raised on another rank ({where}); "
            "nothing was committed or loaded"
        )
    return [str(v or "") for v in gathered]


#: The key of a gathered verdict that is an exception, not a reason.
_RAISED = "raised"


def guard_save(
    check: Check,
    ranks: RankGroup,
    *,
    step: int,
    state: object,
    importance: str | Importance,
    reference: Mapping[str, object] | None,
) -> tuple[str | Importance, Mapping[str, object] | None]:
    """The importance and reference a guarded save commits with.

    Every rank runs ``check`` on its own state (a collective: give the same check
    on every rank); if any fails, the save is demoted to ``transient`` -- scratch,
    evicted first, never a recovery point -- and the reason goes into its
    reference values under :data:`SUSPECT_KEY`, with a :class:`SuspectStateWarning`.
    Passed, the save goes on unchanged.
    """
    values = {str(k): v for k, v in (reference or {}).items()}
    subject = CheckInput(step, state, {k: v for k, v in values.items() if _is_json(v)})
    verdicts = agreed_verdicts(check, subject, ranks)
    failed = [(rank, why) for rank, why in enumerate(verdicts) if why]
    if not failed:
        return importance, reference
    reason = failed[0][1] if len(verdicts) == 1 else "; ".join(f"rank {r}: {w}" for r, w in failed)
    warnings.warn(
        f"step {step} failed the save check ({reason}): committed as transient and suspect",
        SuspectStateWarning,
        stacklevel=3,
    )
    return Importance.TRANSIENT, {**values, SUSPECT_KEY: reason}


def _is_json(value: object) -> TypeGuard[JsonValue]:
    return value is None or isinstance(value, str | int | float | bool | list | tuple | dict)


def reference_of(reference: JsonValue) -> dict[str, JsonValue]:
    """A manifest's reference values as a dict (empty when there are none)."""
    return dict(reference) if isinstance(reference, dict) else {}


def saved_suspect(reference: JsonValue) -> str:
    """Why the save guard refused this checkpoint ("" when it did not)."""
    value = reference_of(reference).get(SUSPECT_KEY)
    return value if isinstance(value, str) else ""
