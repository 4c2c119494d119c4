"""What a trainer integration does when it loads or gives up a checkpoint.

* :func:`load_at_or_before`: the checkpoint asked for, or -- when it is damaged
  or missing -- the newest valid one before it, with a
  :class:`~mouthguard.errors.CheckpointFallbackWarning`. Never a newer one: a
  resume must not jump forward past what the trainer asked for.
* :func:`give_up`: the trainer no longer wants a checkpoint (Lightning's top-k
  dropped it). It goes to the trash, from which a retention pass purges it after
  the level's delay -- unless it is held or critical, which are kept, or a
  retention rule still keeps it (the newest valid checkpoint, keep-last), in which
  case the pass lifts the mark. Nothing is deleted here.
"""

from __future__ import annotations

import warnings

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import LoadedCheckpoint
from mouthguard.checkpoint.sidecars import CopyRef, mark_trashed
from mouthguard.checkpoint.writer import utc_now
from mouthguard.errors import (
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NoValidCheckpointError,
    StateMismatchError,
)
from mouthguard.policy.importance import Importance


def load_at_or_before(checkpointer: Checkpointer, step: int) -> LoadedCheckpoint:
    """Load ``step``, else the newest valid checkpoint older than it (with a warning).

    Raises:
        NoValidCheckpointError: neither ``step`` nor any older checkpoint loads.
        StateMismatchError: ``step`` itself cannot be loaded by this process.
    """
    try:
        return checkpointer.load(step)
    except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
        why = str(exc)
    run = checkpointer.run
    older = sorted((s for s in checkpointer.steps() if s < step), reverse=True)
    for candidate in older:
        warnings.warn(
            f"checkpoint {run} step {step} cannot be loaded ({why}); "
            f"falling back to step {candidate}",
            CheckpointFallbackWarning,
            stacklevel=2,
        )
        try:
            return checkpointer.load(candidate)
        except (CorruptCheckpointError, StateMismatchError) as exc:
            step, why = candidate, str(exc)
    raise NoValidCheckpointError(
        f"checkpoint {run} step {step} cannot be loaded ({why}) and no older one is valid"
    )


def give_up(checkpointer: Checkpointer, step: int, reason: str) -> str:
    """Trash ``step`` unless it is held or critical; return what was done, for the log."""
    info = checkpointer.info(step, missing_ok=True)
    run = checkpointer.run
    if info is None:
        return f"{run} step {step} is not in the store: nothing to remove"
    if info.holds:
        return f"kept {run} step {step}: held ({', '.join(info.holds)})"
    if info.importance is Importance.CRITICAL:
        return f"kept {run} step {step}: critical checkpoints are never deleted automatically"
    when = utc_now()
    tiers = catalog.tiers_holding(checkpointer.store.tiers, run, step)
    for tier in tiers:
        mark_trashed(CopyRef(tier, run, step), reason, when)
    return f"{run} step {step} put in the trash on {len(tiers)} tier(s): {reason}"
