"""The save pipeline behind ``Checkpointer.save`` and ``save_async``.

One save, synchronous or not, runs the same steps::

    wait for the async save in flight        (one at a time: saves commit in call order)
    [async: listener.save_started()]         background jobs yield from the snapshot on
    flatten the state; what the manifest records besides tensors (SaveRequest)
    [async: lay out the rank file, snapshot the state into the staging buffer, return]
    [sync: listener.save_started()]          background copies yield the disk
    committer.commit_save(fast tier, ...)    every rank's file, then the manifest
                                             (skipped for a save to peer memory only)
    [peers: PeerTier.save]                   the rank files in node memory, copies on peers
    listener.save_finished()                 also when the save failed
    after_commit: hint down, listener.notify_commit   (coordinator only)
    the CheckpointInfo handed back

An async save's burst starts before its snapshot: the snapshot is the part of
the save the training loop waits for, and a replication, scrub or retention
read running beside it (memory bandwidth, CPU for hashing, the disk) would
stretch it. The burst ends when the commit does, so one ``save_started`` is
always paired with one ``save_finished`` (:class:`_Burst`).

A rank that fails before it can write (state that needs pickle) still takes
part in the commit's collectives with its failure, so its peers raise
``RankFailedError`` instead of waiting forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.async_save import AsyncSaver, SaveHandle, Snapshot
from mouthguard.checkpoint.commit import after_commit
from mouthguard.checkpoint.committer import SaveRequest, commit_save
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.peer_tier import PeerTier
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.staging import needs_pinned, snapshot
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.writer import layout_for, write_rank_file, write_rank_image
from mouthguard.errors import MouthguardError
from mouthguard.format import typed_json
from mouthguard.format.lineage import Lineage
from mouthguard.format.manifest import FileRecord, Manifest, SaveTiming, TensorRecord
from mouthguard.format.state_tree import FlatState, flatten_state
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)


class SavePipeline:
    """Saves of one run on one rank: the steps of the module docstring.

    Args:
        store: where the saves go (its fast tier).
        run: the run (already validated).
        ranks: the ranks that save together.
        manifest_keys: signing keys (None: unsigned).
        with_sha256: record every file's sha256.
        listener: who hears of the saves now (asked at every save, None: nobody).
        peers: peer memory, where every save also goes (None: none).
    """

    def __init__(  # noqa: PLR0917 - the Checkpointer's settings, passed through once
        self,
        store: Store,
        run: str,
        ranks: RankGroup,
        manifest_keys: Keyring | None,
        with_sha256: bool,
        listener: Callable[[], CheckpointListener | None],
        peers: PeerTier | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.ranks = ranks
        self.manifest_keys = manifest_keys
        self.with_sha256 = with_sha256
        self.listener = listener
        self.peers = peers
        #: Who saves, for the audit trail (None: ``user@host``).
        self.actor: str | None = None
        #: Gives each save its lineage from (step, state), when the save is requested.
        self.lineage: Callable[[int, object], Lineage | None] | None = None
        #: The staging buffer and the thread of async saves (one save in flight).
        self.saver = AsyncSaver(run)

    def save(
        self,
        step: int,
        state: object,
        importance: str | Importance,
        reference: Mapping[str, object] | None,
        *,
        to_store: bool = True,
    ) -> CheckpointInfo:
        """``Checkpointer.save``: committed on the fast tier (``to_store``) and in peer memory."""
        level = parse_importance(importance)
        catalog.validate_step(step)
        self.saver.wait_previous()
        started = time.perf_counter()
        try:
            flat, request = self._request(step, state, level, reference)
        except Exception as exc:
            self._fail_with_peers(step, level, exc, to_store=to_store)
            raise
        request = replace(request, timing=lambda: _timing("sync", started, stall=None))

        def write_rank(tier: Tier, staging: str) -> tuple[FileRecord, list[TensorRecord]]:
            return write_rank_file(
                tier,
                staging,
                rank=self.ranks.rank,
                flat=flat,
                metadata=self._file_metadata(step),
                with_sha256=self.with_sha256,
            )

        manifest = self._commit(request, write_rank, to_store=to_store, bracket=True)
        elapsed = time.perf_counter() - started
        return self._after_commit(
            manifest, level, save_seconds=elapsed, stall_seconds=elapsed, to_store=to_store
        )

    def _commit(
        self,
        request: SaveRequest,
        write_rank: Callable[[Tier, str], tuple[FileRecord, list[TensorRecord]]],
        *,
        to_store: bool,
        bracket: bool,
    ) -> Manifest:
        """Commit on the fast tier (``to_store``), then in peer memory (when configured).

        The store first: a save that must be durable fails before peer memory
        holds a step the store lacks. ``bracket``: the store's write is its own burst
        (a sync save; an async save's burst is already open, from its snapshot on).
        """
        manifest = None
        if to_store:
            tier = self.store.fast
            burst = _Burst(self.listener() if bracket else None)
            burst.begin()  # background copies yield the disk to this burst
            try:
                manifest = commit_save(
                    tier, request, lambda staging: write_rank(tier, staging), self.ranks
                )
            finally:
                burst.end()
        if self.peers is not None:
            in_memory = self.peers.save(request, write_rank)
            manifest = manifest or in_memory
        if manifest is None:
            raise MouthguardError("a save to neither the store nor peer memory")
        return manifest

    def prepare(self, state: object) -> int:
        """``Checkpointer.prepare``: reserve and fault in the staging for ``state``; its bytes.

        Waits for the async save in flight first (its image lives in the buffer).
        """
        self.saver.wait_previous()
        flat = flatten_state(state)
        layout = layout_for(flat, self._file_metadata(0))
        image = self.saver.staging.reserve(layout.size, pinned=needs_pinned(flat))
        self.saver.staging.prefault()
        return int(image.numel())

    def save_async(
        self,
        step: int,
        state: object,
        importance: str | Importance,
        reference: Mapping[str, object] | None,
        *,
        to_store: bool = True,
    ) -> SaveHandle:
        """``Checkpointer.save_async``: returns once the state is snapshotted."""
        entered = time.perf_counter()
        level = parse_importance(importance)
        catalog.validate_step(step)
        waited = self.saver.wait_previous()
        burst = _Burst(self.listener())
        burst.begin()  # background jobs pause from the snapshot on, not only for the write
        try:
            flat, request = self._request(step, state, level, reference)
            layout = layout_for(flat, self._file_metadata(step))
            image = self.saver.staging.reserve(layout.size, pinned=needs_pinned(flat))
            snapshot(flat, layout, image)
        except Exception as exc:
            burst.end()
            if self.ranks.world_size > 1:
                # The peers' background jobs are entering the commit collectives:
                # join them with the failure, in the background like theirs.
                failure = exc
                failed = self.saver.submit(
                    self.run,
                    step,
                    lambda: self._fail_with_peers(step, level, failure, to_store=to_store),
                    Snapshot(0, 0),
                )
                failed.wait()
            raise
        del flat  # the background job needs the layout and the image, not the state
        stall = time.perf_counter() - entered
        log.info("%s step %d snapshotted in %.3f s (waited %.3f s)", self.run, step, stall, waited)
        request = replace(request, timing=lambda: _timing("async", entered, stall=stall))

        def write_rank(tier: Tier, staging: str) -> tuple[FileRecord, list[TensorRecord]]:
            return write_rank_image(
                tier,
                staging,
                rank=self.ranks.rank,
                layout=layout,
                image=memoryview(image.numpy()).cast("B"),  # type: ignore[arg-type]
                with_sha256=self.with_sha256,
            )

        def job() -> CheckpointInfo:
            try:
                manifest = self._commit(request, write_rank, to_store=to_store, bracket=False)
            finally:
                burst.end()
            elapsed = time.perf_counter() - entered
            return self._after_commit(
                manifest, level, save_seconds=elapsed, stall_seconds=stall, to_store=to_store
            )

        return self.saver.submit(self.run, step, job, Snapshot(stall, waited))

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
            self.run,
            step,
            level,
            flat.skeleton,
            reference_json,
            signing=self.manifest_keys,
            actor=self.actor,
            lineage=None if self.lineage is None else self.lineage(step, state),
        )
        return flat, request

    def _fail_with_peers(
        self, step: int, level: Importance, exc: Exception, *, to_store: bool
    ) -> CheckpointInfo:
        """Take part in a multi-rank commit with a local failure, so no peer waits forever.

        Every rank then raises: this one ``exc``, the others RankFailedError. With
        one rank it just raises ``exc``. The commit joined is the one the peers
        run first: the store's, or peer memory's for a save to memory only.
        """
        if self.ranks.world_size > 1:

            def fail(_tier: Tier, _staging: str) -> tuple[FileRecord, list[TensorRecord]]:
                raise exc

            request = SaveRequest(self.run, step, level, None)
            self._commit(request, fail, to_store=to_store, bracket=False)
        raise exc

    def _file_metadata(self, step: int) -> dict[str, str]:
        return {
            "format": "mouthguard.checkpoint",
            "run": self.run,
            "step": str(step),
            "rank": str(self.ranks.rank),
        }

    def _after_commit(
        self,
        manifest: Manifest,
        level: Importance,
        *,
        save_seconds: float,
        stall_seconds: float,
        to_store: bool = True,
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
        if not to_store:
            assert self.peers is not None  # a save to the store or peer memory
            tier = self.peers.area.tier
        elif self.ranks.is_coordinator:
            after_commit(tier, manifest, self.listener())
        final = catalog.checkpoint_prefix(self.run, manifest.step)
        copy = CopyInfo(tier=tier.name, location=tier.location(final))
        return CheckpointInfo.from_manifest(
            manifest, (copy,), save_seconds=save_seconds, stall_seconds=stall_seconds
        )


def _timing(mode: str, started: float, *, stall: float | None) -> SaveTiming:
    """The save's timing now (``started`` on ``perf_counter``); a sync save stalls throughout."""
    seconds = time.perf_counter() - started
    return SaveTiming(mode, seconds, seconds if stall is None else stall)


class _Burst:
    """One save's burst as the listener hears it: begun at most once, ended exactly once after.

    ``end`` may be called from another thread than ``begin`` (an async save ends
    its burst in the background job) and more than once (only the first counts).
    """

    def __init__(self, listener: CheckpointListener | None) -> None:
        self._listener = listener
        self._open = False
        self._lock = threading.Lock()

    def begin(self) -> None:
        """Tell the listener a save started (background jobs pause at their next chunk)."""
        with self._lock:
            if self._listener is None or self._open:
                return
            self._open = True
        self._listener.save_started()

    def end(self) -> None:
        """Tell the listener the save ended, if it was told it began."""
        with self._lock:
            if self._listener is None or not self._open:
                return
            self._open = False
        self._listener.save_finished()


def _reference_json(reference: Mapping[str, object] | None) -> JsonValue:
    return None if reference is None else typed_json.encode(dict(reference), root="reference")
