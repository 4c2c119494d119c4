"""The checkpoint layer as adapters see it: everything a trainer integration or the dashboard uses.

Adapters (``mouthguard.integrations``, ``mouthguard.dashboard``) import checkpoint
things from this module only (``tests/test_layers.py`` enforces it), so the
checkpoint layer's other modules -- the commit protocol, sidecars, the audit
trail's writer -- can change shape without breaking them, and what an adapter
may rely on is written down in one place.

* saving and loading: :class:`Checkpointer`, :class:`Store`, :class:`RankGroup`,
  :class:`SaveHandle`, :class:`CheckpointInfo`;
* names and places: :func:`validate_run`, :func:`validate_step`,
  :func:`tiers_holding`, :func:`read_manifest`;
* what a trainer does when it gives a checkpoint up: :func:`trash_released`;
* what an operator's page shows: :func:`gather`, :func:`runs_of`,
  :func:`steps_of`, :func:`tier_facts`, :class:`CheckpointView`,
  :func:`describe_view`, :func:`unreadable_checkpoints`,
  :class:`UnreadableCheckpoint`, the audit trail (:func:`read_trails`,
  :func:`merged`, :func:`latest_acts`), and peer memory as a node keeps it
  (:func:`node_areas`, :class:`NodeArea`).
"""

from __future__ import annotations

from mouthguard.checkpoint.async_save import SaveHandle
from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.audit_check import latest_acts, merged, read_trails
from mouthguard.checkpoint.catalog import tiers_holding, validate_run, validate_step
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.describe import describe_view, unreadable_checkpoints
from mouthguard.checkpoint.gathering import CheckpointView, gather, runs_of, steps_of, tier_facts
from mouthguard.checkpoint.info import CheckpointInfo, UnreadableCheckpoint
from mouthguard.checkpoint.peer_memory import NodeArea, node_areas
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef, mark_trashed
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.writer import utc_now


def trash_released(checkpointer: Checkpointer, step: int, reason: str) -> int:
    """Put every copy of ``step`` in the trash, marked *released* by its trainer.

    One audited act (``trash``) over the tiers holding the step. Nothing is
    deleted: a retention pass purges released copies after the level's delay,
    or lifts the mark where the step is the run's newest valid checkpoint. The
    caller decides whether the step may go (held and critical ones may not).

    Returns:
        How many tiers held a copy (0: nothing was marked).
    """
    run = checkpointer.run
    when = utc_now()
    tiers = tiers_holding(checkpointer.store.tiers, run, step)
    with audited(
        "trash", run, step, tiers, f"released by the trainer: {reason}", checkpointer.actor
    ):
        for tier in tiers:
            mark_trashed(CopyRef(tier, run, step), reason, when, released=True)
    return len(tiers)


__all__ = [
    "CheckpointInfo",
    "CheckpointView",
    "Checkpointer",
    "NodeArea",
    "RankGroup",
    "SaveHandle",
    "Store",
    "UnreadableCheckpoint",
    "describe_view",
    "gather",
    "latest_acts",
    "merged",
    "node_areas",
    "read_manifest",
    "read_trails",
    "runs_of",
    "steps_of",
    "tier_facts",
    "tiers_holding",
    "trash_released",
    "unreadable_checkpoints",
    "validate_run",
    "validate_step",
]
