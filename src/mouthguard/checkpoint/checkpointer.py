"""``Checkpointer``: save, list and load verified checkpoints of one run."""

from __future__ import annotations

import builtins
import datetime as dt
import logging
import os
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.facts import gather, tier_facts
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo, LoadedCheckpoint, Rejection
from mouthguard.checkpoint.quarantine import set_aside
from mouthguard.checkpoint.reader import load_copy, read_manifest, verify_copy
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    place_hold,
    release_hold,
    report_damage,
    write_importance,
)
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.checkpoint.writer import (
    commit,
    framework_versions,
    new_transaction_id,
    staging_prefix,
    utc_now,
    write_rank_file,
)
from mouthguard.errors import (
    CheckpointExistsError,
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MouthguardError,
    NoValidCheckpointError,
    ObjectExistsError,
    StateMismatchError,
    is_data_damage,
)
from mouthguard.format import typed_json
from mouthguard.format.manifest import MANIFEST_NAME, Manifest
from mouthguard.format.state_tree import FlatState, flatten_state
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.policy.placement import plan_placement, protection_status
from mouthguard.tiers.base import Tier

if TYPE_CHECKING:
    from mouthguard.jobs.service import BackgroundService

log = logging.getLogger(__name__)


def _datetime(timestamp: float | None) -> dt.datetime | None:
    return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.UTC)


#: Partial saves younger than this are assumed to be still in flight.
DEFAULT_GRACE_SECONDS = 3600.0


class Checkpointer:
    """Saves and loads checkpoints of one training run.

    Guarantees:

    * ``save`` returns only after the checkpoint is committed and durable on the
      fast tier; a crash at any moment leaves either the complete checkpoint or
      nothing that ``list``/``load`` accept.
    * ``load`` checks every byte against the manifest's checksums while reading,
      and with ``step=None`` falls back to the next older valid checkpoint (with a
      :class:`CheckpointFallbackWarning` naming what was wrong).
    * Nothing is pickled: tensors go to safetensors rank files, everything else to
      typed JSON in the manifest.

    Args:
        store: a :class:`Store`, or a path accepted by :func:`open_store`.
        run: the run's name (a safe path segment).
        with_sha256: also record sha256 of every file (tamper evidence, slower).
        background: replicate in a background thread of this process (default:
            whenever the store has more than one tier). Off, replication is left
            to ``mouthguard agent`` or explicit ``Replicator`` passes.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        run: str,
        *,
        with_sha256: bool = False,
        background: bool | None = None,
    ) -> None:
        self.store = store if isinstance(store, Store) else open_store(store)
        self.run = catalog.validate_run(run)
        self.with_sha256 = with_sha256
        # Replication runs in-process by default wherever there is a second tier.
        self.background = len(self.store.tiers) > 1 if background is None else background

    # --- save ------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: object,
        importance: str | Importance = "routine",
        *,
        reference: Mapping[str, object] | None = None,
    ) -> CheckpointInfo:
        """Save ``state`` as checkpoint ``step``; committed and durable when it returns.

        Args:
            step: the training step (unique within the run).
            state: nested dicts/lists/tuples of tensors and plain values.
            importance: ``transient``, ``routine``, ``milestone``, ``critical`` (or
                ``golden``); recorded in the manifest.
            reference: optional values (e.g. ``{"loss": 2.31}``) stored with the
                checkpoint to sanity-check a resume.

        Raises:
            UnsupportedStateError: ``state`` holds something that needs pickle.
            CheckpointExistsError: ``step`` is already committed.
            TierError: the tier failed (the partial save is removed).
        """
        level = parse_importance(importance)
        catalog.step_dir(step)
        started = time.perf_counter()
        flat = flatten_state(state)
        reference_json = (
            None if reference is None else typed_json.encode(dict(reference), root="reference")
        )
        service = self._background()
        if service is not None:
            service.gate.save_started()  # background copies yield the disk to this burst
        try:
            manifest, tier = self._write(step, flat, level, reference_json)
        finally:
            if service is not None:
                service.gate.save_finished()
        elapsed = time.perf_counter() - started
        log.info(
            "saved %s step %d (%s, %d bytes) in %.3f s",
            self.run,
            step,
            level.value,
            manifest.nbytes,
            elapsed,
        )
        self._hint(CopyRef(tier, self.run, step), level, manifest)
        if service is not None:
            service.notify_commit(self.run, step)
        final = catalog.checkpoint_prefix(self.run, step)
        copy = CopyInfo(tier=tier.name, location=tier.location(final))
        return CheckpointInfo.from_manifest(manifest, (copy,), save_seconds=elapsed)

    def _write(
        self, step: int, flat: FlatState, level: Importance, reference: JsonValue
    ) -> tuple[Manifest, Tier]:
        """Write and commit one copy on the fast tier (the commit protocol in writer.py)."""
        tier = self.store.fast
        if tier.exists(catalog.manifest_key(self.run, step)):
            self._set_aside_if_damaged(tier, step)
        staging = staging_prefix(tier, self.run, step, new_transaction_id())
        final = catalog.checkpoint_prefix(self.run, step)
        try:
            record, tensors = write_rank_file(
                tier,
                staging,
                rank=0,
                flat=flat,
                metadata={
                    "format": "mouthguard.checkpoint",
                    "run": self.run,
                    "step": str(step),
                    "rank": "0",
                },
                with_sha256=self.with_sha256,
            )
            manifest = Manifest(
                run=self.run,
                step=step,
                importance=level,
                created=utc_now(),
                world_size=1,
                files=(record,),
                tensors=tuple(tensors),
                states=(flat.skeleton,),
                framework=framework_versions(),
                reference=reference,
            )
            commit(tier, staging, final, manifest)
        except ObjectExistsError:
            # Another writer committed (or is committing) this step: on tiers without
            # rename our objects sit next to theirs, so nothing may be cleaned up here.
            if staging != final:
                _remove_quietly(tier, staging)
            raise CheckpointExistsError(
                f"checkpoint {self.run} step {step} was committed by another writer"
            ) from None
        except BaseException:
            if staging != final:
                _remove_quietly(tier, staging)
            elif not tier.exists(catalog.manifest_key(self.run, step)):
                # No rename (object stores): remove our own uncommitted rank file so
                # a retry of this step is not blocked by it.
                _remove_key_quietly(tier, final + catalog.rank_file_name(0))
            raise
        return manifest, tier

    # --- background replication ------------------------------------------------

    def _background(self) -> BackgroundService | None:
        """The store's background service, started on first use (None when disabled)."""
        if not self.background:
            return None
        from mouthguard.jobs.service import service_for  # noqa: PLC0415 - jobs sit above checkpoint

        return service_for(self.store)

    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        """Say a save of ``nbytes`` comes in ``seconds_until_save``: copies yield the disk."""
        service = self._background()
        if service is not None:
            service.gate.announce(seconds_until_save, nbytes)

    def wait_replicated(self, timeout: float = 300.0) -> bool:
        """Block until background replication has nothing queued or in flight.

        Returns False on timeout (or when background replication is disabled and
        there is something it would have had to do).
        """
        service = self._background()
        if service is None:
            return len(self.store.tiers) == 1
        return service.wait_idle(timeout)

    def _set_aside_if_damaged(self, tier: Tier, step: int) -> None:
        """Handle a save onto an already committed step.

        A resumed run that fell back past a damaged checkpoint will save that step
        again. The old copy is verified: if it is valid the save is refused; if it
        is damaged it is set aside (:func:`set_aside`: renamed to an invisible
        ``<step>.rejected-<id>`` where the tier can rename) so the new save commits.
        """
        prefix = catalog.checkpoint_prefix(self.run, step)
        try:
            verify_copy(tier, prefix, read_manifest(tier, self.run, step))
        except MouthguardError as exc:
            if not tier.exists(catalog.manifest_key(self.run, step)):
                return  # set aside meanwhile (e.g. by the replicator): nothing in the way
            set_aside(CopyRef(tier, self.run, step), str(exc))
            return
        raise CheckpointExistsError(f"checkpoint {self.run} step {step} already exists")

    # --- list ------------------------------------------------------------------

    def exists(self, step: int) -> bool:
        """Whether ``step`` is committed on any tier (validity unchecked)."""
        return bool(self._tiers_holding(step))

    def steps(self) -> list[int]:
        """Committed steps on any tier (manifest present), ascending; validity unchecked."""
        found: set[int] = set()
        for tier in self.store.tiers:
            found.update(catalog.committed_steps(tier, self.run))
        return sorted(found)

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints with a readable manifest, ascending by step.

        A step directory without a manifest is invisible. A committed checkpoint
        whose manifest is damaged on every tier is left out (``verify`` reports it).
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
        view = gather(self.store, self.run, step)
        if view is None:
            if missing_ok:
                return None
            raise CheckpointNotFoundError(f"no readable checkpoint {self.run} step {step}")
        for tier, reason in view.damaged:
            log.warning("%s step %d on tier %s: %s", self.run, step, tier.name, reason)
        prefix = catalog.checkpoint_prefix(self.run, step)
        copies = tuple(
            CopyInfo(
                tier=c.tier,
                location=self.store.tier(c.tier).location(prefix),
                verified=c.verified,
                verified_at=_datetime(c.verified_at),
                trashed_at=_datetime(c.trashed_at),
            )
            for c in view.facts.copies
        )
        placement = plan_placement(view.facts.importance, tier_facts(self.store), self.store.policy)
        protection = protection_status(view.facts, placement)
        trashed = bool(copies) and all(c.trashed_at is not None for c in copies)
        return CheckpointInfo.from_manifest(
            view.manifest,
            copies,
            importance=view.facts.importance,
            holds=view.holds,
            state="trashed" if trashed else protection.state,
            protection=protection.missing,
        )

    # --- mutable facts ---------------------------------------------------------

    def set_importance(
        self, step: int, importance: str | Importance, *, reason: str = ""
    ) -> CheckpointInfo:
        """Promote or demote checkpoint ``step`` (recorded on every copy, hinted down).

        Raises:
            CheckpointNotFoundError: ``step`` is not committed.
        """
        level = parse_importance(importance)
        now = utc_now()
        for ref in self._copy_refs(step):
            write_importance(ref, level, reason or f"set to {level.value}", now)
            self._hint(ref, level)
        return self._info_of_committed(step)

    def hold(self, step: int, name: str = "hold", *, reason: str = "") -> CheckpointInfo:
        """Place a named hold: the checkpoint is not deleted from any tier while it stands."""
        now = utc_now()
        for ref in self._copy_refs(step):
            place_hold(ref, name, reason, now)
        return self._info_of_committed(step)

    def release(self, step: int, name: str = "hold") -> bool:
        """Release a named hold from every copy; return whether any copy had it."""
        released = [release_hold(ref, name) for ref in self._copy_refs(step)]
        return any(released)

    def _info_of_committed(self, step: int) -> CheckpointInfo:
        info = self.info(step)
        assert info is not None  # info() raises rather than return None without missing_ok
        return info

    def _copy_refs(self, step: int) -> builtins.list[CopyRef]:
        refs = [CopyRef(t, self.run, step) for t in self._tiers_holding(step)]
        if not refs:
            raise CheckpointNotFoundError(f"no committed checkpoint {self.run} step {step}")
        return refs

    def _hint(self, ref: CopyRef, level: Importance, manifest: Manifest | None = None) -> None:
        """Pass the importance down to the storage (xattrs, object tags): advisory only.

        ``manifest`` saves re-reading it when the caller has it (the save just wrote it).
        """
        try:
            if manifest is None:
                manifest = read_manifest(ref.tier, ref.run, ref.step)
            for name in [*(f.name for f in manifest.files), MANIFEST_NAME]:
                ref.tier.annotate(ref.key(name), {"importance": level.value})
        except MouthguardError as exc:
            log.info("could not pass the importance hint down for %s: %s", ref, exc)

    # --- load ------------------------------------------------------------------

    def load(self, step: int | None = None, into: object = None) -> LoadedCheckpoint:
        """Load a checkpoint, verifying every byte.

        Args:
            step: the step to load; ``None`` loads the newest *valid* checkpoint,
                falling back past damaged ones with a :class:`CheckpointFallbackWarning`.
            into: optional state whose tensors (matched by key path, same dtype and
                shape) are filled in place and returned instead of new tensors. If
                every candidate fails, their contents are undefined.

        Raises:
            CheckpointNotFoundError: nothing is committed (for ``step``, or at all).
            CorruptCheckpointError: every copy of the requested ``step`` is damaged.
            NoValidCheckpointError: ``step=None`` and no checkpoint is valid.
            StateMismatchError: ``into`` does not fit the checkpoint.
        """
        candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
        if step is not None:
            catalog.step_dir(step)
        rejected: builtins.list[Rejection] = []
        try:
            return self._load_first_valid(candidates, step, into, rejected)
        finally:
            # Repairs start only once this load is done reading: a repair racing it
            # could set aside a copy the load is about to try.
            service = self._background() if rejected else None
            for damaged in sorted({r.step for r in rejected}) if service else ():
                service.notify_commit(self.run, damaged)  # type: ignore[union-attr]

    def _load_first_valid(
        self,
        candidates: builtins.list[int],
        step: int | None,
        into: object,
        rejected: builtins.list[Rejection],
    ) -> LoadedCheckpoint:
        for candidate in candidates:
            loaded = self._load_step(candidate, into, rejected, fallback=step is None)
            if loaded is not None:
                return loaded
        if not rejected:
            what = f"step {step}" if step is not None else "any step"
            raise CheckpointNotFoundError(
                f"run {self.run!r} has no committed checkpoint for {what}"
            )
        reasons = "; ".join(f"step {r.step} on {r.tier}: {r.reason}" for r in rejected)
        if step is not None:
            raise CorruptCheckpointError(
                f"every copy of {self.run} step {step} is damaged: {reasons}"
            )
        raise NoValidCheckpointError(f"run {self.run!r} has no valid checkpoint: {reasons}")

    def _load_step(
        self, step: int, into: object, rejected: builtins.list[Rejection], *, fallback: bool
    ) -> LoadedCheckpoint | None:
        prefix = catalog.checkpoint_prefix(self.run, step)
        for tier in self._tiers_holding(step):
            try:
                manifest = read_manifest(tier, self.run, step)
                state = load_copy(tier, prefix, manifest, into=into)
            except StateMismatchError:
                raise
            except MouthguardError as exc:
                rejected.append(Rejection(step, tier.name, str(exc)))
                then = (
                    "trying another copy or an older checkpoint"
                    if fallback
                    else "trying another copy"
                )
                where = f"checkpoint {self.run} step {step} on tier {tier.name!r}"
                warnings.warn(
                    f"{where} rejected: {exc}; {then}",
                    CheckpointFallbackWarning,
                    stacklevel=4,
                )
                log.warning("rejected %s step %d on %s: %s", self.run, step, tier.name, exc)
                if is_data_damage(exc):
                    self._report_damage(CopyRef(tier, self.run, step), str(exc))
                continue
            copy = CopyInfo(tier=tier.name, location=tier.location(prefix))
            info = CheckpointInfo.from_manifest(manifest, (copy,))
            return LoadedCheckpoint(step, state, info, tier.name, list(rejected))
        return None

    def _report_damage(self, ref: CopyRef, reason: str) -> None:
        """Leave a damage report so the replicator confirms and repairs the copy.

        Best effort: a read-only or failing tier must not turn a successful
        fallback into an error.
        """
        try:
            report_damage(ref, reason, utc_now())
        except MouthguardError as exc:
            log.info("could not record the damage of %s: %s", ref, exc)

    def _tiers_holding(self, step: int) -> builtins.list[Tier]:
        key = catalog.manifest_key(self.run, step)
        return [t for t in self.store.tiers if t.exists(key)]

    # --- housekeeping ----------------------------------------------------------

    def collect_garbage(
        self, *, grace_seconds: float = DEFAULT_GRACE_SECONDS
    ) -> builtins.list[catalog.GarbageReport]:
        """Remove leftovers of interrupted saves older than ``grace_seconds``, per tier."""
        return [
            catalog.collect_partial_saves(tier, self.run, grace_seconds=grace_seconds)
            for tier in self.store.tiers
        ]


def _remove_key_quietly(tier: Tier, key: str) -> None:
    """Best-effort removal of one object of a failed save."""
    try:
        tier.delete(key)
    except MouthguardError as exc:
        log.warning("could not remove %s on %s: %s", key, tier.name, exc)


def _remove_quietly(tier: Tier, prefix: str) -> None:
    """Best-effort cleanup of a failed save; the original error is what matters."""
    try:
        tier.delete_prefix(prefix)
    except MouthguardError as exc:
        log.warning("could not remove partial save %s on %s: %s", prefix, tier.name, exc)
