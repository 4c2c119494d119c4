"""What a trainer integration does when it gives up a checkpoint.

A resume is ``Checkpointer.load(at_or_before=step)``: the one load path that
honours suspect marks, damage and checkpoints deleted during the walk.

:func:`give_up`: the trainer no longer wants a checkpoint (Lightning's top-k
dropped it). It goes to the trash, marked *released* by its trainer, from which
a retention pass purges it after the level's delay -- unless it is held or
critical, which are kept, or it is the run's newest valid checkpoint (a recovery
point), in which case the pass lifts the mark. Keep-last, best-k and
keep-within never keep a released checkpoint: the store keeps what the trainer
keeps. Nothing is deleted here.
"""

from __future__ import annotations

from mouthguard.checkpoint.surface import Checkpointer, trash_released
from mouthguard.policy.importance import Importance


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
    count = trash_released(checkpointer, step, reason)
    return f"{run} step {step} put in the trash on {count} tier(s): {reason}"
