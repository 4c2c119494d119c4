"""Saves on a trainer's behalf: numbered, in the background, errors kept until asked for.

Both trainer integrations hand their checkpoints to one :class:`TrainerSaves`.
It owns a :class:`~mouthguard.checkpoint.Checkpointer` that saves from this
process alone (``RankGroup()``): Lightning and the Hugging Face ``Trainer``
write single-file checkpoints from global rank 0 only, so the other ranks never
take part and must not be waited for.

Contracts:

* **Numbering.** A save gets the trainer's global step as its mouthguard step
  unless that would not be newer than the last step of the run; then it gets
  the last step + 1. Steps therefore grow with every save, which the store
  needs (steps are unique; retention counts the newest), while a trainer may
  write several checkpoints at one global step (Lightning's top-k file and
  ``last.ckpt``) or, resumed from an older checkpoint, global steps the run
  already holds. The trainer's own step is recorded with each checkpoint.
* **One save in flight.** :meth:`TrainerSaves.submit` returns once the state is
  snapshotted (the trainer's stall); writing and commit run in the background.
  The next :meth:`submit`, and :meth:`settle`, wait for it first and raise its
  error there: a failed save is never lost, and never silently retried.
* **The best is critical, one at a time.** A save submitted as the new best of
  some rule (``best_of=``) is ``critical``; once it has *committed*, the previous
  best of the same rule is demoted to the level it would have had otherwise, so
  a run does not pile up critical checkpoints that retention may never delete.
  If the new best fails to commit, the previous one stays critical.
* **Saves of other instances.** :meth:`TrainerSaves.wait_for_peers` waits for
  the save in flight of every other instance in this process on the same store
  and run (a second Trainer, or ``trainer.save_checkpoint(p)`` followed by a new
  Trainer's ``fit(ckpt_path=p)``): the pointer names a step that is committed by
  the time a load reads it. Their errors stay with them.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mouthguard.checkpoint.surface import Checkpointer, CheckpointInfo, RankGroup, SaveHandle, Store
from mouthguard.errors import CheckpointNotFoundError
from mouthguard.integrations.recovery import give_up
from mouthguard.policy.importance import Importance, parse_importance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Best:
    """The checkpoint currently critical as the best of one rule, and its level otherwise."""

    step: int
    otherwise: Importance


class TrainerSaves:
    """One run's saves from a trainer integration (see the module docstring).

    Args:
        store: a :class:`Store` or a path accepted by ``open_store``.
        run: the run's name in the store.
        background: replicate in this process (``Checkpointer``'s ``background=``).
    """

    def __init__(
        self, store: Store | str | os.PathLike[str], run: str, *, background: bool | None = None
    ) -> None:
        self.checkpointer = Checkpointer(store, run, background=background, group=RankGroup())
        _INSTANCES.add(self)
        self._pending: SaveHandle | None = None
        self._after_commit: list[Callable[[], None]] = []
        self._last_step: int | None = None
        self._best: dict[str, Best] = {}

    @property
    def run(self) -> str:
        """The run's name."""
        return self.checkpointer.run

    def next_step(self, global_step: int) -> int:
        """The mouthguard step the next save of ``global_step`` gets (see Numbering)."""
        if self._last_step is None:
            steps = self.checkpointer.steps()
            self._last_step = steps[-1] if steps else -1
        return max(global_step, self._last_step + 1)

    def submit(
        self,
        global_step: int,
        state: object,
        importance: Importance,
        *,
        reference: Mapping[str, object] | None = None,
        best_of: str | None = None,
        otherwise: Importance = Importance.MILESTONE,
        replaces: int | None = None,
    ) -> int:
        """Snapshot ``state`` and save it in the background; return its mouthguard step.

        Args:
            global_step: the trainer's step (see Numbering).
            state: the state (tensors and typed-JSON values).
            importance: its level.
            reference: values recorded with it (the trainer's step, the metric, ...).
            best_of: the rule (e.g. a ``ModelCheckpoint``'s key) this save is the new
                best of; the previous best of that rule is demoted once this commits.
            otherwise: the level this save falls back to when a later best replaces it.
            replaces: a step this save supersedes (the trainer overwrote its path):
                it is given up once this one has committed
                (:func:`~mouthguard.integrations.recovery.give_up`).

        Raises:
            MouthguardError: the previous save failed (its error), or ``state``
                cannot be stored (``UnsupportedStateError``, before anything runs).
        """
        self.settle()
        step = self.next_step(global_step)
        handle = self.checkpointer.save_async(step, state, importance, reference=reference)
        self._last_step = step
        self._pending = handle
        if best_of is not None:
            self._after_commit.append(lambda: self.note_best(best_of, step, otherwise))
        if replaces is not None and replaces != step:
            why = f"superseded by step {step} under the same name"
            self._after_commit.append(lambda: self.give_up(replaces, why))
        return step

    def wait_for_peers(self) -> None:
        """Wait for the saves in flight of the other instances of this store and run."""
        store, run = self.checkpointer.store, self.run
        for other in list(_INSTANCES):
            theirs = other.checkpointer.store
            same = theirs is store or (bool(store.source) and theirs.source == store.source)
            if other is not self and other.run == run and same:
                other.checkpointer.flush()  # their errors are theirs to raise

    def give_up(self, step: int, reason: str) -> None:
        """Trash ``step`` unless held or critical (logged either way)."""
        log.info("%s", give_up(self.checkpointer, step, reason))

    def settle(self) -> CheckpointInfo | None:
        """Wait for the save in flight; raise its error, else finish what its commit allows.

        Returns:
            The committed checkpoint's info, or None when nothing was in flight.
        """
        handle, self._pending = self._pending, None
        actions, self._after_commit = self._after_commit, []
        if handle is None:
            return None
        info = handle.result()  # the background save's own error, raised here
        for action in actions:
            action()
        return info

    def note_best(self, rule: str, step: int, otherwise: Importance) -> None:
        """Record ``step`` as the committed best of ``rule``; demote the previous best.

        Also called on resume, with what the trainer's restored state says is its best.
        """
        previous = self._best.get(rule)
        self._best[rule] = Best(step, otherwise)
        if previous is None or previous.step == step:
            return
        try:
            self.checkpointer.set_importance(
                previous.step,
                previous.otherwise,
                reason=f"no longer the best: step {step} is the best of {rule}",
            )
        except CheckpointNotFoundError:
            log.info("the previous best, step %d, is gone already", previous.step)

    def close(self) -> None:
        """Settle the save in flight (raising its error) and free the staging buffer."""
        try:
            self.settle()
        finally:
            self.checkpointer.close()


#: Every live instance in this process (see "Saves of other instances").
_INSTANCES: weakref.WeakSet[TrainerSaves] = weakref.WeakSet()


#: A trainer integration's importance override: two trainer-specific arguments -> a level.
ImportanceRule = Callable[[Any, Any], "str | Importance"]


def as_rule(importance: str | Importance | ImportanceRule | None) -> ImportanceRule | None:
    """``importance=`` as a rule: a fixed level becomes a rule that always gives it.

    Raises:
        ValueError: a level name that is not one.
    """
    if isinstance(importance, str | Importance):
        level = parse_importance(importance)
        return lambda _first, _second: level
    return importance
