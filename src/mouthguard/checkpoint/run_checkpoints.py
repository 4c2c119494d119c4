"""A run's committed checkpoints: listing and describing them, changing their mutable facts.

:class:`RunCheckpoints` is the part of :class:`~mouthguard.checkpoint.checkpointer.Checkpointer`
that reads the catalogue and the sidecars of one run (``exists``, ``steps``,
``list``, ``info``, ``unreadable``) and changes what may change after a commit
(``set_importance``, ``hold``, ``release``: on every copy, in the audit trail).
It saves and loads nothing; the ``Checkpointer`` inherits it, so these stay its
methods and their contracts are documented here.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from contextlib import AbstractContextManager

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import Outcome, audited
from mouthguard.checkpoint.describe import describe, unreadable_checkpoints
from mouthguard.checkpoint.hints import pass_hint_down
from mouthguard.checkpoint.info import CheckpointInfo, UnreadableCheckpoint
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    place_hold,
    release_hold,
    write_importance,
)
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.writer import utc_now
from mouthguard.errors import CheckpointNotFoundError
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring


class RunCheckpoints:
    """The committed checkpoints of one run in one store, and their mutable facts.

    The subclass sets ``store``, ``run`` and ``actor`` and provides
    ``manifest_keys`` (the audit trail signs its records with them).
    """

    store: Store
    run: str
    #: Who acts in the audit trail by default (None: ``$MOUTHGUARD_ACTOR``, else user@host).
    actor: str | None

    #: The keys saves sign with and loads require (None: unsigned).
    manifest_keys: Keyring | None

    # --- list ------------------------------------------------------------------

    def exists(self, step: int) -> bool:
        """Whether ``step`` is committed on any tier (validity unchecked)."""
        return bool(self._tiers_holding(step))

    def steps(self) -> list[int]:
        """Committed steps on any tier (manifest present), ascending; validity unchecked.

        A tier that cannot be listed (an object store that is down) is skipped
        with a warning while another tier answers.
        """
        return catalog.committed_steps_on(self.store.tiers, self.run)

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints with a readable manifest, ascending by step.

        A step directory without a manifest is invisible. A checkpoint whose
        every copy is damaged is listed with state ``damaged``; one whose manifest
        is damaged on every tier cannot be described here and is listed by
        :meth:`unreadable` instead.
        """
        infos = []
        for step in self.steps():
            info = self.info(step, missing_ok=True)
            if info is not None:
                infos.append(info)
        return infos

    def info(self, step: int, *, missing_ok: bool = False) -> CheckpointInfo | None:
        """Info of ``step``: its manifest merged with every copy's sidecar facts.

        The effective importance is the newest recorded change on any copy (else
        the saved one); the holds are the union over copies; the state says how
        far the copies meet the policy's placement (committed -> verified ->
        protected), or ``trashed`` once every copy is in the trash.
        """
        info = describe(self.store, self.run, step)
        if info is None and not missing_ok:
            raise CheckpointNotFoundError(f"no readable checkpoint {self.run} step {step}")
        return info

    def unreadable(self, steps: Iterable[int] | None = None) -> builtins.list[UnreadableCheckpoint]:
        """Committed checkpoints whose manifest is proven damaged on every tier holding it.

        ``steps`` limits the search (default: every committed step).

        :meth:`list` cannot describe them (their importance, size and time are in
        the unreadable manifest); they are never loaded, copied or deleted
        automatically, and stay listed here until an operator acts.
        """
        return unreadable_checkpoints(
            self.store, self.run, self.steps() if steps is None else steps
        )

    # --- mutable facts ---------------------------------------------------------

    def set_importance(
        self,
        step: int,
        importance: str | Importance,
        *,
        reason: str = "",
        actor: str | None = None,
    ) -> CheckpointInfo:
        """Promote or demote checkpoint ``step`` (recorded on every copy, hinted down).

        Recorded in the audit trail by ``actor`` (default: the checkpointer's).

        Raises:
            CheckpointNotFoundError: ``step`` is not committed.
            TierError: the audit trail could not record it (nothing was changed).
        """
        level = parse_importance(importance)
        now = utc_now()
        refs = self._copy_refs(step)
        why = reason or f"set to {level.value}"
        with self._audited("importance", step, refs, f"{level.value}: {why}", actor):
            for ref in refs:
                write_importance(ref, level, why, now)
                pass_hint_down(ref, level)
        return self._info_of_committed(step)

    def hold(
        self, step: int, name: str = "hold", *, reason: str = "", actor: str | None = None
    ) -> CheckpointInfo:
        """Place a named hold: the checkpoint is not deleted from any tier while it stands.

        Recorded in the audit trail by ``actor`` (default: the checkpointer's).
        """
        now = utc_now()
        refs = self._copy_refs(step)
        with self._audited("hold", step, refs, f"{name}: {reason}" if reason else name, actor):
            for ref in refs:
                place_hold(ref, name, reason, now)
        return self._info_of_committed(step)

    def release(
        self, step: int, name: str = "hold", *, reason: str = "", actor: str | None = None
    ) -> bool:
        """Release a named hold from every copy; return whether any copy had it.

        Recorded in the audit trail (outcome ``not needed`` when no copy had it).
        """
        refs = self._copy_refs(step)
        why = f"{name}: {reason}" if reason else name
        with self._audited("release", step, refs, why, actor) as outcome:
            # Every copy loses the hold: no short-circuit.
            released = any([release_hold(ref, name) for ref in refs])  # noqa: C419
            if not released:
                outcome.result = "not needed"
        return released

    def _audited(
        self, act: str, step: int, refs: builtins.list[CopyRef], reason: str, actor: str | None
    ) -> AbstractContextManager[Outcome]:
        return audited(
            act,
            self.run,
            step,
            [r.tier for r in refs],
            reason,
            actor or self.actor,
            self.manifest_keys,
        )

    def _info_of_committed(self, step: int) -> CheckpointInfo:
        info = self.info(step)
        assert info is not None  # info() raises rather than return None without missing_ok
        return info

    def _copy_refs(self, step: int) -> builtins.list[CopyRef]:
        refs = [CopyRef(t, self.run, step) for t in self._tiers_holding(step)]
        if not refs:
            raise CheckpointNotFoundError(f"no committed checkpoint {self.run} step {step}")
        return refs

    def _tiers_holding(self, step: int) -> builtins.list[Tier]:
        return catalog.tiers_holding(self.store.tiers, self.run, step)
