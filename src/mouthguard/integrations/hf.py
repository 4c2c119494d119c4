"""The Hugging Face ``Trainer``: every checkpoint it writes, kept in a mouthguard store.

::

    from mouthguard.integrations.hf import MouthguardCallback, restore

    trainer = Trainer(..., callbacks=[MouthguardCallback("./mouthguard-store", run="my-run")])
    trainer.train()
    # the output directory is lost:
    path = restore("./mouthguard-store", "my-run", "out")   # out/checkpoint-N
    trainer.train(resume_from_checkpoint=str(path))

Contracts:

* After the ``Trainer`` has written ``checkpoint-N/`` (``on_save``, global rank 0
  only), the callback stores that directory as one mouthguard checkpoint, every
  file byte for byte (:mod:`~mouthguard.integrations.dir_files`), so a restored
  copy opens with ``from_pretrained`` and resumes with ``resume_from_checkpoint``.
  The files are snapshotted before ``on_save`` returns; writing and commit run in
  the background, and a failure is raised by the next save or at the end of
  training (``on_train_end``), never lost.
* Importance, by default: the ``Trainer``'s best checkpoint (``best_model_checkpoint``
  by ``metric_for_best_model``) is ``critical`` -- the previous best, also one
  from before a restart, is demoted to ``routine`` once the new one has
  committed -- the final checkpoint of the
  training (``global_step == max_steps``) is ``milestone``, the rest ``routine``.
  ``importance=`` overrides it: a level, or a callable ``(args, state) -> level``.
* :func:`restore` writes the newest valid checkpoint (or ``step``) back as
  ``dest/checkpoint-N/``, falling back past damaged ones with a
  :class:`~mouthguard.errors.CheckpointFallbackWarning`.
* The ``Trainer``'s ``save_total_limit`` rotates its local directories only; the
  store's retention decides what the store keeps.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from typing_extensions import override

from mouthguard.checkpoint.surface import Checkpointer, RankGroup, Store
from mouthguard.errors import FormatError, UnsignedRestoreWarning
from mouthguard.integrations.dir_files import check_relative, read_dir, write_dir
from mouthguard.integrations.saves import ImportanceRule, TrainerSaves, as_rule
from mouthguard.policy.importance import Importance, parse_importance

log = logging.getLogger(__name__)


#: The ``TrainerCallback`` rule key under which the best checkpoint is tracked.
_BEST = "metric_for_best_model"


class MouthguardCallback(TrainerCallback):
    """Stores each ``checkpoint-N`` directory the ``Trainer`` writes (see the module docstring).

    Args:
        store: a :class:`~mouthguard.Store` or a path accepted by ``open_store``.
        run: the run's name in the store.
        importance: ``None`` for the default rule, a level for every checkpoint, or
            a callable ``(args, state) -> level``.
        background: replicate to the store's other tiers in this process
            (default: whenever the store has more than one tier).
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        run: str,
        importance: str | Importance | ImportanceRule | None = None,
        *,
        background: bool | None = None,
    ) -> None:
        self.saves = TrainerSaves(store, run, background=background)
        self._rule = as_rule(importance)

    @property
    def checkpointer(self) -> Checkpointer:
        """The :class:`~mouthguard.Checkpointer` of the run (list, hold, info, ...)."""
        return self.saves.checkpointer

    @override
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Snapshot ``checkpoint-N/`` into the store (background write; see the module docstring).

        Raises:
            MouthguardError: the previous save failed (its own error), or the
                directory holds something other than regular files.
        """
        if not state.is_world_process_zero:
            return
        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        directory = Path(args.output_dir) / name
        level, best = self._importance(args, state, name)
        step = self.saves.submit(
            state.global_step,
            {"files": read_dir(directory), "hf": {"checkpoint_dir": name}},
            level,
            reference=_reference(state),
            best_of=_BEST if best else None,
            otherwise=Importance.ROUTINE,
        )
        log.info("stored %s as %s step %d (%s)", directory, self.saves.run, step, level)

    @override
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After a resume: the checkpoint the restored state calls best is the current best.

        So the first new best of this process demotes it, as it would have without
        the restart (only if the store holds it as ``critical``: a level set by
        hand to something else is left alone).
        """
        best = getattr(state, "best_global_step", None)
        if not state.is_world_process_zero or not best:
            return
        info = self.checkpointer.info(best, missing_ok=True)
        if info is not None and info.importance is Importance.CRITICAL:
            self.saves.note_best(_BEST, best, Importance.ROUTINE)

    @override
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Wait for the last save and raise its error; free the staging buffer."""
        self.saves.close()

    def _importance(self, args: Any, state: Any, name: str) -> tuple[Importance, bool]:
        if self._rule is not None:
            return parse_importance(self._rule(args, state)), False
        return default_importance(state, name)


def default_importance(state: Any, name: str) -> tuple[Importance, bool]:
    """The default rule for ``checkpoint-N`` named ``name``: ``(level, is the new best)``."""
    best = state.best_model_checkpoint
    if best is not None and Path(best).name == name:
        return Importance.CRITICAL, True
    if state.max_steps and state.global_step >= state.max_steps:
        return Importance.MILESTONE, False
    return Importance.ROUTINE, False


def _reference(state: Any) -> dict[str, object]:
    """The Trainer's step and epoch, and the best metric when there is one."""
    reference: dict[str, object] = {"global_step": int(state.global_step)}
    if state.epoch is not None:
        reference["epoch"] = float(state.epoch)
    if isinstance(state.best_metric, int | float):
        reference["best_metric"] = float(state.best_metric)
    return reference


def restore(
    store: Store | str | os.PathLike[str],
    run: str,
    dest: str | os.PathLike[str],
    step: int | None = None,
) -> Path:
    """Write a stored ``checkpoint-N`` back under ``dest``; return its path.

    Args:
        store: the store the callback saved to.
        run: the run's name.
        dest: the ``Trainer``'s output directory (created if needed).
        step: the mouthguard step to resume from; ``None`` takes the newest. When
            it is damaged, suspect or gone, the newest valid checkpoint before it
            is restored instead, with a ``CheckpointFallbackWarning`` (never a
            newer one, never a suspect one).

    Raises:
        CheckpointNotFoundError: no checkpoint of ``run`` (at or before ``step``)
            is committed.
        NoValidCheckpointError: none of them is valid.
        FileExistsError: ``dest/checkpoint-N`` exists already (nothing is overwritten).
        FormatError: the checkpoint was not written by :class:`MouthguardCallback`.

    Warns:
        UnsignedRestoreWarning: the store has no manifest key and the restored
            directory holds files the ``Trainer`` unpickles (``optimizer.pt``,
            ``rng_state.pth``...).
    """
    checkpointer = Checkpointer(store, run, background=False, group=RankGroup())
    loaded = checkpointer.load(at_or_before=step)
    state = loaded.state
    if not isinstance(state, dict) or not isinstance(state.get("hf"), dict):
        raise FormatError(f"{run} step {loaded.step} is not a Hugging Face Trainer checkpoint")
    name = check_relative(state["hf"].get("checkpoint_dir"))
    if "/" in name:
        raise FormatError(f"{run} step {loaded.step}: checkpoint directory {name!r} is not a name")
    files = state.get("files")
    pickled = sorted(
        str(f) for f in (files if isinstance(files, dict) else {}) if _PICKLED.search(str(f))
    )
    if pickled and checkpointer.manifest_keys is None:
        warnings.warn(
            f"{run} step {loaded.step} comes from an unsigned store, and the Trainer will "
            f"unpickle {', '.join(pickled[:4])}{' ...' if len(pickled) > 4 else ''} on resume: "
            "anyone who could write the store could have planted them. Set a manifest key "
            "($MOUTHGUARD_MANIFEST_KEY) so that only signed checkpoints are restored",
            UnsignedRestoreWarning,
            stacklevel=2,
        )
    return write_dir(files, Path(dest) / name)


#: Files a ``Trainer`` (through ``torch.load``) unpickles on resume.
_PICKLED = re.compile(r"\.(pt|pth|bin|pkl|pickle)$")
