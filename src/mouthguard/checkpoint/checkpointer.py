"""``Checkpointer``: save, list and load verified checkpoints of one run."""

from __future__ import annotations

import builtins
import datetime as dt
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Self

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.async_save import AsyncSaver, SaveHandle, Snapshot
from mouthguard.checkpoint.commit import after_commit
from mouthguard.checkpoint.committer import RankWriter, SaveRequest, save_copy
from mouthguard.checkpoint.facts import gather, tier_facts, unreadable_copies
from mouthguard.checkpoint.hints import pass_hint_down
from mouthguard.checkpoint.info import (
    CheckpointInfo,
    CopyInfo,
    LoadedCheckpoint,
    Rejection,
    UnreadableCheckpoint,
)
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.loading import Loader
from mouthguard.checkpoint.ranks import detect_ranks
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    place_hold,
    release_hold,
    write_importance,
)
from mouthguard.checkpoint.staging import needs_pinned, snapshot
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.checkpoint.writer import (
    layout_for,
    utc_now,
    write_rank_file,
    write_rank_image,
)
from mouthguard.errors import (
    CheckpointNotFoundError,
)
from mouthguard.format import typed_json
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.format.state_tree import FlatState, flatten_state
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.policy.placement import plan_placement, protection_status
from mouthguard.tiers.base import Tier

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
        signing_key: manifest signing keys (``[ID=]KEY[,...]``, raw key bytes or a
            ``Keyring``; see :mod:`mouthguard.format.signing`). Default: the
            store's, else ``$MOUTHGUARD_MANIFEST_KEY``, else none. With a key,
            saves record sha256 and sign the manifest, and ``load`` accepts only
            validly signed checkpoints, checking every file's sha256.
        background: replicate in a background thread of this process (default:
            whenever the store has more than one tier, on the coordinator rank).
            Off, replication is left to ``mouthguard agent`` or ``Replicator`` passes.
        group: the torch.distributed process group whose ranks save together
            (default: the whole job when torch.distributed is initialised). Every
            rank must construct its Checkpointer in the same order (a collective),
            and the fast tier must be shared by all ranks.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        run: str,
        *,
        with_sha256: bool = False,
        signing_key: KeySpec | None = None,
        background: bool | None = None,
        group: Any = None,
    ) -> None:
        self.store = store if isinstance(store, Store) else open_store(store)
        self.run = catalog.validate_run(run)
        self.manifest_keys = (
            manifest_keys(signing_key)
            if signing_key is not None
            else self.store.manifest_keys or keys_from_env()
        )
        # A signature vouches for the files only through their sha256.
        self.with_sha256 = with_sha256 or self.manifest_keys is not None
        self.ranks = detect_ranks(group)
        # Replication runs in-process by default wherever there is a second tier;
        # one replicator per job is enough, so only on the coordinator.
        if background is None:
            background = len(self.store.tiers) > 1 and self.ranks.is_coordinator
        self.background = background
        self._saver = AsyncSaver(self.run)

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

        With torch.distributed initialised this is a collective: every rank passes
        its own state and writes its own rank file; the checkpoint commits only if
        every rank succeeded (:mod:`~mouthguard.checkpoint.committer`). An async
        save still in flight is waited for first, so saves commit in call order.

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
            RankFailedError: another rank failed (nothing was committed).
            TierError: the tier failed (the partial save is removed).
        """
        level = parse_importance(importance)
        catalog.step_dir(step)
        self._saver.wait_previous()
        started = time.perf_counter()
        try:
            flat, request = self._request(step, state, level, reference)
        except Exception as exc:
            self._fail_with_peers(step, level, exc)
            raise
        tier = self.store.fast

        def write_rank(staging: str) -> tuple[FileRecord, builtins.list[TensorRecord]]:
            return write_rank_file(
                tier,
                staging,
                rank=self.ranks.rank,
                flat=flat,
                metadata=self._file_metadata(step),
                with_sha256=self.with_sha256,
            )

        manifest = self._commit_on_fast(request, write_rank)
        elapsed = time.perf_counter() - started
        return self._after_commit(manifest, level, save_seconds=elapsed, stall_seconds=elapsed)

    def save_async(
        self,
        step: int,
        state: object,
        importance: str | Importance = "routine",
        *,
        reference: Mapping[str, object] | None = None,
    ) -> SaveHandle:
        """Snapshot ``state`` and save it in the background; return once it is safe to mutate.

        The state is copied into a staging buffer reused across saves (pinned host
        memory when tensors are on CUDA) laid out as the final rank file; writing,
        checksumming, commit and replication then run in a background thread. One
        save is in flight at a time: a new save first waits for the previous one
        (backpressure, counted in its stall). Multi-rank: a collective, like
        :meth:`save`; the ranks' background threads commit together.

        Returns:
            A :class:`SaveHandle`: ``result()`` gives the :class:`CheckpointInfo`
            (with ``stall_seconds``) or raises the save's error.

        Raises:
            UnsupportedStateError: ``state`` holds something that needs pickle
                (raised here, before anything runs in the background).
        """
        entered = time.perf_counter()
        level = parse_importance(importance)
        catalog.step_dir(step)
        waited = self._saver.wait_previous()
        try:
            flat, request = self._request(step, state, level, reference)
            layout = layout_for(flat, self._file_metadata(step))
            image = self._saver.staging.reserve(layout.size, pinned=needs_pinned(flat))
            snapshot(flat, layout, image)
        except Exception as exc:
            if self.ranks.world_size > 1:
                # The peers' background jobs are entering the commit collectives:
                # join them with the failure, in the background like theirs.
                failure = exc
                failed = self._saver.submit(
                    self.run,
                    step,
                    lambda: self._fail_with_peers(step, level, failure),
                    Snapshot(0, 0),
                )
                failed.wait()
            raise
        del flat  # the background job needs the layout and the image, not the state
        stall = time.perf_counter() - entered
        log.info("%s step %d snapshotted in %.3f s (waited %.3f s)", self.run, step, stall, waited)
        tier = self.store.fast

        def write_rank(staging: str) -> tuple[FileRecord, builtins.list[TensorRecord]]:
            return write_rank_image(
                tier,
                staging,
                rank=self.ranks.rank,
                layout=layout,
                image=memoryview(image.numpy()).cast("B"),  # type: ignore[arg-type]
                with_sha256=self.with_sha256,
            )

        def job() -> CheckpointInfo:
            manifest = self._commit_on_fast(request, write_rank)
            elapsed = time.perf_counter() - entered
            return self._after_commit(manifest, level, save_seconds=elapsed, stall_seconds=stall)

        return self._saver.submit(self.run, step, job, Snapshot(stall, waited))

    def flush(self) -> None:
        """Block until the async save in flight (if any) has finished."""
        self._saver.wait_previous()

    @property
    def staging_pinned(self) -> bool:
        """Whether the async saves' staging buffer is page-locked (pinned) host memory.

        True once :meth:`save_async` staged state with a tensor on CUDA (the
        device-to-host copies then run asynchronously at full PCIe speed); False
        before the first async save, after :meth:`close`, and for CPU-only state.
        """
        return self._saver.staging.pinned

    def close(self) -> None:
        """Finish the async save in flight and free the staging buffer.

        Background replication is not waited for: :meth:`wait_replicated` does that.
        A failed async save's error stays with its handle; ``close`` does not raise it.
        """
        self._saver.close()

    def __enter__(self) -> Self:
        """``with Checkpointer(...) as ckpt:`` closes it on the way out (see :meth:`close`)."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _request(
        self,
        step: int,
        state: object,
        level: Importance,
        reference: Mapping[str, object] | None,
    ) -> tuple[FlatState, SaveRequest]:
        """The state split for writing, and what the commit records besides its tensors."""
        flat = flatten_state(state)
        reference_json = _reference_json(reference)
        request = SaveRequest(
            self.run, step, level, flat.skeleton, reference_json, signing=self.manifest_keys
        )
        return flat, request

    def _fail_with_peers(self, step: int, level: Importance, exc: Exception) -> CheckpointInfo:
        """Take part in a multi-rank commit with a local failure, so no peer waits forever.

        Every rank then raises: this one ``exc``, the others RankFailedError. With
        one rank it just raises ``exc``.
        """
        if self.ranks.world_size > 1:

            def fail(_staging: str) -> tuple[FileRecord, builtins.list[TensorRecord]]:
                raise exc

            save_copy(self.store.fast, SaveRequest(self.run, step, level, None), fail, self.ranks)
        raise exc

    def _file_metadata(self, step: int) -> dict[str, str]:
        return {
            "format": "mouthguard.checkpoint",
            "run": self.run,
            "step": str(step),
            "rank": str(self.ranks.rank),
        }

    def _commit_on_fast(self, request: SaveRequest, write_rank: RankWriter) -> Manifest:
        """Write and commit on the fast tier while background copies yield the disk."""
        listener = self._listener()
        if listener is not None:
            listener.save_started()  # background copies yield the disk to this burst
        try:
            return save_copy(self.store.fast, request, write_rank, self.ranks)
        finally:
            if listener is not None:
                listener.save_finished()

    def _after_commit(
        self, manifest: Manifest, level: Importance, *, save_seconds: float, stall_seconds: float
    ) -> CheckpointInfo:
        """Log, then :func:`~mouthguard.checkpoint.commit.after_commit`; the caller's info."""
        log.info(
            "saved %s step %d (%s, %d bytes, %s) in %.3f s, stalled %.3f s",
            self.run,
            manifest.step,
            level.value,
            manifest.nbytes,
            self.ranks.describe(),
            save_seconds,
            stall_seconds,
        )
        tier = self.store.fast
        if self.ranks.is_coordinator:
            after_commit(tier, manifest, self._listener())
        final = catalog.checkpoint_prefix(self.run, manifest.step)
        copy = CopyInfo(tier=tier.name, location=tier.location(final))
        return CheckpointInfo.from_manifest(
            manifest, (copy,), save_seconds=save_seconds, stall_seconds=stall_seconds
        )

    # --- background replication ------------------------------------------------

    def _listener(self) -> CheckpointListener | None:
        """Who hears of this checkpointer's saves: the store's listener (None when disabled).

        In practice the store's background service, started on first use
        (``mouthguard/wiring.py`` installs it; this layer never imports jobs).
        """
        return self.store.listener() if self.background else None

    def announce(self, seconds_until_save: float, nbytes: int) -> None:
        """Say a save of ``nbytes`` comes in ``seconds_until_save``: copies yield the disk."""
        listener = self._listener()
        if listener is not None:
            listener.announce(seconds_until_save, nbytes)

    def wait_replicated(self, timeout: float = 300.0) -> bool:
        """Block until background replication has nothing queued or in flight.

        Returns False on timeout (or when background replication is disabled and
        there is something it would have had to do).
        """
        listener = self._listener()
        if listener is None:
            return len(self.store.tiers) == 1
        return listener.wait_idle(timeout)

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
        view = gather(self.store, self.run, step)
        if view is None:
            if missing_ok:
                return None
            raise CheckpointNotFoundError(f"no readable checkpoint {self.run} step {step}")
        prefix = catalog.checkpoint_prefix(self.run, step)
        damage = {name: side.damage for name, side in view.sidecars if side.damage}
        copies = tuple(
            CopyInfo(
                tier=c.tier,
                location=self.store.tier(c.tier).location(prefix),
                verified=c.verified,
                verified_at=_datetime(c.verified_at),
                trashed_at=_datetime(c.trashed_at),
                damage=damage.get(c.tier, ""),
            )
            for c in view.facts.copies
        ) + tuple(
            CopyInfo(tier=t.name, location=t.location(prefix), damage=f"manifest: {reason}")
            for t, reason in view.damaged
        )
        for tier, reason in view.unreachable:
            log.warning("%s step %d on tier %s: %s", self.run, step, tier.name, reason)
        placement = plan_placement(view.facts.importance, tier_facts(self.store), self.store.policy)
        protection = protection_status(view.facts, placement)
        trashed = bool(copies) and all(c.trashed_at is not None for c in copies)
        state: str = protection.state
        missing = protection.missing
        if all(c.damage for c in copies):
            state = "damaged"
            missing = ("every copy is damaged: " + _damage_line(copies), *missing)
        return CheckpointInfo.from_manifest(
            view.manifest,
            copies,
            importance=view.facts.importance,
            holds=view.holds,
            state="trashed" if trashed else state,
            protection=missing,
        )

    def unreadable(self, steps: Iterable[int] | None = None) -> builtins.list[UnreadableCheckpoint]:
        """Committed checkpoints whose manifest is proven damaged on every tier holding it.

        ``steps`` limits the search (default: every committed step).

        :meth:`list` cannot describe them (their importance, size and time are in
        the unreadable manifest); they are never loaded, copied or deleted
        automatically, and stay listed here until an operator acts.
        """
        found = []
        prefix_of = catalog.checkpoint_prefix
        for step in self.steps() if steps is None else steps:
            copies = unreadable_copies(self.store, self.run, step)
            if copies:
                found.append(
                    UnreadableCheckpoint(
                        self.run,
                        step,
                        tuple(
                            CopyInfo(t.name, t.location(prefix_of(self.run, step)), damage=why)
                            for t, why in copies
                        ),
                    )
                )
        return found

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
            pass_hint_down(ref, level)
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
            StateMismatchError: ``into`` does not fit the checkpoint, or it was saved
                by a different number of ranks (``mouthguard.dcp`` reshards).

        Multi-rank: a collective; every rank loads its own rank's state, and a
        checkpoint counts as valid only if every rank could load its part.
        """
        if step is not None:
            catalog.step_dir(step)
        loader = Loader(self.store, self.run, self.ranks, self.manifest_keys)
        # Every rank walks the coordinator's list, so all try the same steps in order.
        candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
        listed = self.ranks.broadcast(list(candidates))
        assert isinstance(listed, list)
        rejected: builtins.list[Rejection] = []
        try:
            return loader.first_valid([int(str(c)) for c in listed], step, into, rejected)
        finally:
            # Repairs start only once this load is done reading: a repair racing it
            # could set aside a copy the load is about to try.
            listener = self._listener() if rejected else None
            if listener is not None:
                for damaged in sorted({r.step for r in rejected}):
                    listener.request_repair(self.run, damaged)

    def _tiers_holding(self, step: int) -> builtins.list[Tier]:
        return catalog.tiers_holding(self.store.tiers, self.run, step)

    # --- housekeeping ----------------------------------------------------------

    def collect_garbage(
        self, *, grace_seconds: float = DEFAULT_GRACE_SECONDS
    ) -> builtins.list[catalog.GarbageReport]:
        """Remove leftovers of interrupted saves older than ``grace_seconds``, per tier."""
        return [
            catalog.collect_partial_saves(tier, self.run, grace_seconds=grace_seconds)
            for tier in self.store.tiers
        ]


def _damage_line(copies: tuple[CopyInfo, ...]) -> str:
    return "; ".join(f"{c.tier}: {c.damage}" for c in copies)


def _reference_json(reference: Mapping[str, object] | None) -> JsonValue:
    return None if reference is None else typed_json.encode(dict(reference), root="reference")
