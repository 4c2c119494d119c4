"""PyTorch Lightning: checkpoints through mouthguard with one line.

::

    from mouthguard.integrations.lightning import CheckpointIO

    trainer = Trainer(plugins=[CheckpointIO("./mouthguard-store", run="my-run")])
    trainer.fit(model, ckpt_path="last")     # resumes from the store

Contracts:

* ``save_checkpoint(checkpoint, path)`` stores the dict Lightning built as a
  mouthguard checkpoint -- tensors as tensors in the rank file, everything else
  (loops, callbacks, hyper-parameters) as typed JSON, never pickle -- and leaves a
  pointer file at ``path`` (:mod:`~mouthguard.integrations.pointer`), so that
  Lightning's own file checks (``ckpt_path="last"``, name collisions) keep working.
  It returns once the state is snapshotted; the write runs in the background
  and its error is raised by the next save, load or remove, or by ``teardown``.
  An object that needs pickle is an error naming its key path, raised before
  anything is written. ``dict`` subclasses (Lightning's ``AttributeDict`` of
  hyper-parameters) are stored, and loaded back, as plain dicts.
* ``load_checkpoint(path)`` returns the dict that was saved for ``path`` (tensors
  on the CPU, as Lightning's own loader with its default ``map_location``). A
  damaged or missing checkpoint falls back to the newest valid one saved before
  it, with a :class:`~mouthguard.errors.CheckpointFallbackWarning`.
* ``LightningModule.load_from_checkpoint(path)`` cannot read a pointer (it
  unpickles the file): :func:`load_from_checkpoint` ``(Model, store, path)`` is
  the same call for one.
* :func:`restore_pointers` writes the pointers again into a checkpoint directory
  that was lost with its machine; the checkpoints never left the store.
* ``remove_checkpoint(path)`` removes the pointer and puts the checkpoint in the
  store's trash, released by its trainer -- never a held or critical one
  (:func:`~mouthguard.integrations.recovery.give_up`). A checkpoint superseded
  under its path but left live by a killed run is given up on the next start.
* Importance, by default (:func:`default_importance`): the current best of a
  ``ModelCheckpoint`` with a ``monitor`` is ``critical`` (the previous best is
  demoted to ``routine`` once the new one has committed), anything else --
  top-k files, ``last.ckpt``, epoch ends -- ``routine``: milestones only where
  asked, so ``save_top_k`` bounds what the store keeps. ``importance=`` overrides it with
  a level or a callable ``(checkpoint, path) -> level``; ``trainer.save_checkpoint(
  path, storage_options={"importance": "critical"})`` overrides it for one save.

Only global rank 0 calls a ``CheckpointIO`` (Lightning's single-file strategies:
single device, DDP); strategies that save sharded state themselves (FSDP with
``state_dict_type="sharded"``, DeepSpeed) bypass it -- use ``mouthguard.dcp``
there. Paths are local paths (the pointer is a local file).
"""

from __future__ import annotations

import io
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO
from typing_extensions import override

from mouthguard.checkpoint.surface import (
    Checkpointer,
    RankGroup,
    Store,
    read_manifest,
    tiers_holding,
)
from mouthguard.errors import (
    CheckpointNotFoundError,
    FormatError,
    MouthguardError,
    UnsupportedStateError,
)
from mouthguard.integrations.pointer import Pointer, read_pointer, remove_pointer, write_pointer
from mouthguard.integrations.saves import ImportanceRule, TrainerSaves, as_rule
from mouthguard.pathsafety import is_safe_relative_path
from mouthguard.policy.importance import Importance, parse_importance

log = logging.getLogger(__name__)


class CheckpointIO(_LightningCheckpointIO):
    """A Lightning ``CheckpointIO`` that stores checkpoints in a mouthguard store.

    Args:
        store: a :class:`~mouthguard.Store` or a path accepted by ``open_store``.
        run: the run's name in the store.
        importance: ``None`` for the default rule (see the module docstring), a
            level for every save, or a callable ``(checkpoint, path) -> level``.
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
        super().__init__()
        self.saves = TrainerSaves(store, run, background=background)
        self._rule = as_rule(importance)
        self._leftovers_done = False

    @property
    def checkpointer(self) -> Checkpointer:
        """The :class:`~mouthguard.Checkpointer` of the run (list, hold, info, ...)."""
        return self.saves.checkpointer

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Snapshot ``checkpoint`` into the store in the background; leave a pointer at ``path``.

        Raises:
            UnsupportedStateError: a value needs pickle (its key path is named).
            MouthguardError: the previous save failed (its own error).
            TypeError: ``storage_options`` is not ``None`` or ``{"importance": level}``.
        """
        self._finish_leftovers()
        where = str(path)
        level, best_of = self._importance(checkpoint, where, storage_options)
        global_step = int(checkpoint.get("global_step", 0))
        replaced = self._replaced(where)
        try:
            step = self.saves.submit(
                global_step,
                _plain_dicts(checkpoint),
                level,
                reference=_reference(checkpoint, where),
                best_of=best_of,
                otherwise=Importance.ROUTINE,
                replaces=replaced,
            )
        except UnsupportedStateError as exc:
            raise UnsupportedStateError(
                f"{exc}. Lightning checkpoint {where}: keep such values out of the checkpoint "
                "or convert them to tensors, numbers, strings, lists and dicts (e.g. in "
                "on_save_checkpoint, and back in on_load_checkpoint)"
            ) from exc
        write_pointer(where, Pointer(self.saves.run, step))
        log.info("Lightning checkpoint %s -> %s step %d (%s)", where, self.saves.run, step, level)

    @override
    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint saved for ``path`` (or the newest valid one before it, warned).

        ``map_location`` and ``weights_only`` are accepted for Lightning's sake:
        tensors come back on the CPU, and nothing is ever unpickled.

        A checkpoint marked suspect (its state failed a check) is passed over like
        a damaged one, as is one deleted while the load walks back.

        Raises:
            CheckpointNotFoundError: nothing is at ``path``, or no checkpoint of its
                run at or before its step is committed.
            FormatError: the file at ``path`` is not a mouthguard pointer.
            NoValidCheckpointError: neither it nor an older checkpoint is valid.
        """
        self.saves.settle()
        self.saves.wait_for_peers()  # a save of another CheckpointIO may name this path
        self._finish_leftovers()
        pointer = read_pointer(path)
        checkpointer = self.checkpointer
        if pointer.run != self.saves.run:
            checkpointer = Checkpointer(
                checkpointer.store, pointer.run, background=False, group=RankGroup()
            )
        loaded = checkpointer.load(at_or_before=pointer.step)
        state = loaded.state
        if not isinstance(state, dict):
            raise UnsupportedStateError(
                f"{path}: {pointer.run} step {loaded.step} is not a Lightning checkpoint"
            )
        if pointer.run == self.saves.run:
            self._note_best(state)
        return state

    @override
    def remove_checkpoint(self, path: Any) -> None:
        """Remove the pointer at ``path``; trash its checkpoint unless held or critical.

        A file there that is not a pointer (a checkpoint from before the switch) is
        deleted, as Lightning's default ``CheckpointIO`` would.
        """
        self.saves.settle()
        try:
            pointer = read_pointer(path)
        except CheckpointNotFoundError:
            log.info("remove %s: no pointer there, nothing to do", path)
            return
        except FormatError:
            Path(path).unlink(missing_ok=True)
            log.info("remove %s: not a mouthguard pointer, deleted as Lightning would", path)
            return
        remove_pointer(path)
        if pointer.run != self.saves.run:
            log.info("remove %s: kept %s step %d (another run's)", path, pointer.run, pointer.step)
            return
        self.saves.give_up(pointer.step, f"Lightning removed {Path(path).name}")

    @override
    def teardown(self) -> None:
        """Wait for the save in flight and raise its error; free the staging buffer."""
        self.saves.close()

    def _finish_leftovers(self) -> None:
        """Once, on first use: give up what a killed run superseded but never gave up.

        A save under a name already used gives the older checkpoint up only once
        the new one has committed; a run killed in between leaves it live. Here a
        checkpoint is given up when the pointer at the path Lightning saved it
        under now names a newer, committed step of this run -- and only then: a
        missing pointer (a checkpoint directory lost with its machine) proves
        nothing.
        """
        if self._leftovers_done:
            return
        self._leftovers_done = True
        checkpointer = self.checkpointer
        for info in checkpointer.list():
            if info.state == "trashed" or info.importance is Importance.CRITICAL:
                continue
            path = _saved_path(checkpointer, info.step)
            newer = self._replaced(path) if path else None
            # Only once the newer one is committed: a save still in flight may fail.
            if newer is not None and newer > info.step and checkpointer.exists(newer):
                self.saves.give_up(
                    info.step, f"superseded by step {newer} under the same name (found on start)"
                )

    def _replaced(self, path: str) -> int | None:
        """The step of this run that a pointer at ``path`` refers to now, if any."""
        try:
            pointer = read_pointer(path)
        except MouthguardError:  # nothing there, or a file Lightning overwrites as it would
            return None
        return pointer.step if pointer.run == self.saves.run else None

    # --- importance -----------------------------------------------------------------

    def _importance(
        self, checkpoint: Mapping[str, Any], path: str, storage_options: Any
    ) -> tuple[Importance, str | None]:
        if storage_options is not None:
            if not isinstance(storage_options, Mapping) or set(storage_options) != {"importance"}:
                raise TypeError(
                    "mouthguard's CheckpointIO takes storage_options={'importance': level} "
                    f"or None, not {storage_options!r}"
                )
            return parse_importance(storage_options["importance"]), None
        if self._rule is not None:
            return parse_importance(self._rule(checkpoint, path)), None
        return default_importance(checkpoint, path)

    def _note_best(self, checkpoint: Mapping[str, Any]) -> None:
        """After a resume: the restored callbacks' best checkpoints are the current bests."""
        for key, best in _monitored_bests(checkpoint):
            try:
                pointer = read_pointer(best)
            except MouthguardError:  # gone, or not ours: nothing to demote later
                continue
            if pointer.run == self.saves.run:
                self.saves.note_best(key, pointer.step, Importance.ROUTINE)


def load_from_checkpoint(
    cls: type[Any],
    store: Store | str | os.PathLike[str],
    path: str | os.PathLike[str],
    **kwargs: Any,
) -> Any:
    """``cls.load_from_checkpoint(path)`` for a mouthguard pointer at ``path``.

    Lightning's own ``LightningModule.load_from_checkpoint`` runs ``torch.load`` on
    the file it is given, so on a pointer it fails with an unpickling error. This
    loads the checkpoint from ``store`` (verified; the newest valid one at or
    before it, as a resume would) and hands it to Lightning's classmethod as an
    in-memory stream with ``weights_only=True``: only bytes made here from the
    verified state are unpickled, by the restricted unpickler, never anything
    read from storage. ``kwargs`` go to ``cls.load_from_checkpoint``
    (``strict``, hyper-parameter overrides, ...).

    Raises:
        CheckpointNotFoundError: nothing is at ``path``, or nothing loadable is stored.
        FormatError: the file at ``path`` is not a mouthguard pointer.
    """
    import torch  # noqa: PLC0415 - torch is loaded already wherever a module is built

    pointer = read_pointer(path)
    plugin = CheckpointIO(store, run=pointer.run, background=False)
    try:
        checkpoint = plugin.load_checkpoint(path)
    finally:
        plugin.teardown()
    stream = io.BytesIO()
    torch.save(checkpoint, stream)
    stream.seek(0)
    kwargs.setdefault("weights_only", True)
    return cls.load_from_checkpoint(stream, **kwargs)


def restore_pointers(
    store: Store | str | os.PathLike[str], run: str, dirpath: str | os.PathLike[str]
) -> list[Path]:
    """Write the pointer files of ``run`` into ``dirpath`` again, after the directory was lost.

    Every committed checkpoint of ``run`` that this plug-in saved and that is not
    in the trash gets a pointer named as Lightning named its file, in step order,
    so a name saved several times (``last.ckpt``) points to its newest checkpoint.
    Then ``trainer.fit(ckpt_path="last")`` (or the path of a top-k file) resumes as
    it would have before the loss. A checkpoint whose manifest no tier can read is
    skipped (it could not be loaded anyway).

    Returns:
        The pointers written, in the order written.
    """
    checkpointer = Checkpointer(store, run, background=False, group=RankGroup())
    written: list[Path] = []
    for info in checkpointer.list():
        if info.state == "trashed":
            continue
        name = _saved_name(checkpointer, info.step)
        if name is not None:
            target = Path(dirpath) / name
            write_pointer(target, Pointer(run, info.step))
            written.append(target)
    return written


def _saved_path(checkpointer: Checkpointer, step: int) -> str | None:
    """The path Lightning saved ``step`` under (its reference values), if readable."""
    for tier in tiers_holding(checkpointer.store.tiers, checkpointer.run, step):
        try:
            manifest = read_manifest(tier, checkpointer.run, step, checkpointer.manifest_keys)
        except MouthguardError:
            continue
        reference = manifest.reference
        path = reference.get("lightning_path") if isinstance(reference, dict) else None
        return path if isinstance(path, str) and path else None
    return None


def _saved_name(checkpointer: Checkpointer, step: int) -> str | None:
    """The file name Lightning saved ``step`` under (its reference values), if readable."""
    path = _saved_path(checkpointer, step)
    name = Path(path).name if path else ""
    # One plain file name: it names a file in the directory Lightning restores into.
    return name if is_safe_relative_path(name) else None


def default_importance(checkpoint: Mapping[str, Any], path: str) -> tuple[Importance, str | None]:
    """The default rule: ``(level, the ModelCheckpoint it is the new best of, if any)``.

    * ``critical``: ``path`` is the ``best_model_path`` of a ``ModelCheckpoint``
      with a ``monitor`` (Lightning updates it before saving the new best);
    * ``routine``: anything else (``milestone`` only where asked: ``importance=``
      or ``storage_options``).
    """
    for key, best in _monitored_bests(checkpoint):
        if os.path.normpath(best) == os.path.normpath(path):
            return Importance.CRITICAL, key
    return Importance.ROUTINE, None


def _monitored_bests(checkpoint: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(callback key, best_model_path)`` of every ModelCheckpoint with a monitor."""
    callbacks = checkpoint.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return []
    found = []
    for key, cb_state in callbacks.items():
        if not isinstance(cb_state, Mapping) or cb_state.get("monitor") is None:
            continue
        best = cb_state.get("best_model_path")
        if isinstance(best, str) and best:
            found.append((str(key), best))
    return found


def _reference(checkpoint: Mapping[str, Any], path: str) -> dict[str, object]:
    """What is recorded next to the state: the trainer's step and epoch, the path, metrics."""
    reference: dict[str, object] = {"lightning_path": path}
    for key in ("global_step", "epoch"):
        if type(checkpoint.get(key)) is int:
            reference[key] = checkpoint[key]
    callbacks = checkpoint.get("callbacks")
    for cb_state in callbacks.values() if isinstance(callbacks, Mapping) else ():
        monitor = cb_state.get("monitor") if isinstance(cb_state, Mapping) else None
        score = cb_state.get("current_score") if isinstance(monitor, str) else None
        if isinstance(monitor, str) and score is not None and hasattr(score, "item"):
            reference.setdefault(monitor, float(score.item()))
    return reference


def _plain_dicts(value: Any) -> Any:
    """``value`` with every dict subclass (``AttributeDict``) turned into a plain dict.

    Tensors and other leaves are returned as they are (never copied here).
    """
    if type(value) is dict or type(value) is OrderedDict:
        return type(value)((k, _plain_dicts(v)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: _plain_dicts(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain_dicts(v) for v in value]
    if type(value) is tuple:
        return tuple(_plain_dicts(v) for v in value)
    return value
