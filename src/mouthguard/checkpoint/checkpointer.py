"""``Checkpointer``: save, list and load verified checkpoints of one run.

This module is the public API and its contracts. The work is elsewhere, one job
per module: the save pipeline in :mod:`~mouthguard.checkpoint.saving` (and the
commit under it), finding and loading a valid copy in
:mod:`~mouthguard.checkpoint.loading`, listing a run's checkpoints and changing
their importance and holds in :mod:`~mouthguard.checkpoint.run_checkpoints`
(which ``Checkpointer`` inherits), describing a checkpoint from its copies in
:mod:`~mouthguard.checkpoint.describe`, the layout on a tier in
:mod:`~mouthguard.checkpoint.catalog`.
"""

from __future__ import annotations

import builtins
import datetime as dt
import os
from collections.abc import Mapping
from typing import Any, Self

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.async_save import SaveHandle
from mouthguard.checkpoint.checking import Check, guard_save
from mouthguard.checkpoint.info import (
    CheckpointInfo,
    LoadedCheckpoint,
    Rejection,
)
from mouthguard.checkpoint.lineage import Tracker
from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.checkpoint.loading import Loader, target_device, warn_fell_back
from mouthguard.checkpoint.peer_load import resume_from_peers
from mouthguard.checkpoint.peer_memory import PeerMemory
from mouthguard.checkpoint.peer_tier import PeerTier
from mouthguard.checkpoint.ranks import COLLECTIVE_TIMEOUT, detect_ranks
from mouthguard.checkpoint.run_checkpoints import RunCheckpoints
from mouthguard.checkpoint.saving import SavePipeline
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.tiers.key_material import Keyring

#: Partial saves younger than this are assumed to be still in flight.
DEFAULT_GRACE_SECONDS = 3600.0


class Checkpointer(RunCheckpoints):
    """Saves and loads checkpoints of one training run.

    Guarantees:

    * ``save`` returns only after the checkpoint is committed and durable on the
      fast tier; a crash at any moment leaves either the complete checkpoint or
      nothing that ``list``/``load`` accept.
    * ``load`` checks every byte against the manifest's checksums while reading,
      and with ``step=None`` (or ``at_or_before=N``) falls back to the next older
      valid checkpoint, past damaged and suspect ones (with a
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
            ``RankGroup()`` (:mod:`mouthguard.checkpoint.ranks`) saves from this
            process alone even in a distributed job: no collective, rank 0 of 1.
        collective_timeout: seconds one checkpoint collective waits for the
            slowest rank (default 300): the slowest rank's file write must fit in
            it, and a rank that died is given up on after it -- the survivors
            raise :class:`~mouthguard.errors.RankLostError` instead of hanging.
        peers: a :class:`~mouthguard.checkpoint.peer_memory.PeerMemory`: every save
            also goes to node memory with copies on peers in other failure
            domains; transient and routine saves go *only* there (and every
            ``disk_every``-th of them to the store too), milestone and critical
            ones to the store as well. ``load()`` then resumes from the newest
            step complete across peer memory (docs/peer-memory.md). Needs the
            whole job as ``group``.
        actor: who this checkpointer acts for in the audit trail
            (:mod:`~mouthguard.checkpoint.audit`): its commits, importance
            changes and holds. Default ``$MOUTHGUARD_ACTOR``, else ``user@host``.
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
        collective_timeout: float | None = None,
        peers: PeerMemory | None = None,
        actor: str | None = None,
    ) -> None:
        if peers is not None and group is not None:
            raise ValueError("peers= needs the whole job: leave group= out")
        self.actor = actor
        self.store = store if isinstance(store, Store) else open_store(store)
        self.run = catalog.validate_run(run)
        keys = (
            manifest_keys(signing_key)
            if signing_key is not None
            else self.store.manifest_keys or keys_from_env()
        )
        if collective_timeout is not None and not collective_timeout > 0:
            raise ValueError(f"collective_timeout must be > 0 seconds, got {collective_timeout}")
        timeout = (
            COLLECTIVE_TIMEOUT
            if collective_timeout is None
            else dt.timedelta(seconds=collective_timeout)
        )
        self.ranks = detect_ranks(group, timeout)
        # Replication runs in-process by default wherever there is a second tier;
        # one replicator per job is enough, so only on the coordinator.
        if background is None:
            background = len(self.store.tiers) > 1 and self.ranks.is_coordinator
        self.background = background
        #: Peer memory as this rank sees it (None: not configured).
        self.peers = None if peers is None else PeerTier(peers, self.ranks)
        #: Transient and routine saves that went to peer memory only (``disk_every``).
        self._memory_saves = 0
        # A signature vouches for the files only through their sha256.
        self._saves = SavePipeline(
            self.store,
            self.run,
            self.ranks,
            keys,
            with_sha256 or keys is not None,
            self._listener,
            self.peers,
        )
        self._saves.actor = actor
        self._lineage = Tracker(self.run)
        self._saves.lineage = self._lineage.lineage_of_save

    @property
    def manifest_keys(self) -> Keyring | None:
        """The keys saves sign with and loads require (None: unsigned, signatures ignored)."""
        return self._saves.manifest_keys

    @manifest_keys.setter
    def manifest_keys(self, keys: Keyring | None) -> None:
        self._saves.manifest_keys = keys

    @property
    def with_sha256(self) -> bool:
        """Whether saves record every file's sha256 (always with signing keys)."""
        return self._saves.with_sha256

    @with_sha256.setter
    def with_sha256(self, value: bool) -> None:
        self._saves.with_sha256 = value

    # --- save ------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: object,
        importance: str | Importance = "routine",
        *,
        reference: Mapping[str, object] | None = None,
        check: Check | None = None,
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
            check: a guard run on ``state`` first (e.g. ``mouthguard.checks.finite()``);
                a state that fails it is committed only as ``transient``, marked
                suspect with the reason (in the manifest, atomically with the
                commit), with a :class:`SuspectStateWarning`. Multi-rank: give it
                on every rank; one rank failing demotes the whole checkpoint.

        Raises:
            UnsupportedStateError: ``state`` holds something that needs pickle.
            CheckpointExistsError: ``step`` is already committed.
            RankFailedError: another rank failed (nothing was committed).
            TierError: the tier failed (the partial save is removed).
        """
        importance, reference = self._guarded(check, step, state, importance, reference)
        to_store = self._to_store(importance)
        parent = self._lineage.parent
        try:
            return self._saves.save(step, state, importance, reference, to_store=to_store)
        except BaseException:
            self._lineage.failed(parent)
            raise

    def save_async(
        self,
        step: int,
        state: object,
        importance: str | Importance = "routine",
        *,
        reference: Mapping[str, object] | None = None,
        check: Check | None = None,
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

        ``check`` is the guard of :meth:`save`, run on the caller's state before
        the snapshot (its time counts in the stall).

        Raises:
            UnsupportedStateError: ``state`` holds something that needs pickle
                (raised here, before anything runs in the background).
        """
        importance, reference = self._guarded(check, step, state, importance, reference)
        to_store = self._to_store(importance)
        parent = self._lineage.parent
        try:
            return self._saves.save_async(step, state, importance, reference, to_store=to_store)
        except BaseException:
            self._lineage.failed(parent)
            raise

    def _to_store(self, importance: str | Importance) -> bool:
        """Whether a save goes to the store (else to peer memory only): importance decides."""
        if self.peers is None or parse_importance(importance).rank >= Importance.MILESTONE.rank:
            return True
        self._memory_saves += 1
        every = self.peers.config.disk_every
        return every > 0 and self._memory_saves % every == 0

    def prepare(self, state: object) -> int:
        """Make the staging buffer of :meth:`save_async` ready for ``state``; return its bytes.

        The first async save otherwise pays, inside its stall, for allocating the
        buffer -- page-locking it when tensors are on CUDA, which costs seconds for
        gigabytes -- and for faulting in its pages. Called once before the training
        loop (or whenever the state grows), it moves that cost off the training
        path: the first ``save_async`` then stalls like every later one. Only the
        layout is computed; no tensor byte is copied. Calling it again with a state
        of the same size costs one write per page; the buffer only ever grows.

        Raises:
            UnsupportedStateError: ``state`` holds something that needs pickle.
        """
        return self._saves.prepare(state)

    def _guarded(
        self,
        check: Check | None,
        step: int,
        state: object,
        importance: str | Importance,
        reference: Mapping[str, object] | None,
    ) -> tuple[str | Importance, Mapping[str, object] | None]:
        """The importance and reference a save commits with, after its guard (if any)."""
        if check is None:
            return importance, reference
        return guard_save(
            check, self.ranks, step=step, state=state, importance=importance, reference=reference
        )

    def flush(self) -> None:
        """Block until the async save in flight (if any) has finished."""
        self._saves.saver.wait_previous()

    @property
    def staging_pinned(self) -> bool:
        """Whether the async saves' staging buffer is page-locked (pinned) host memory.

        True once :meth:`save_async` staged state with a tensor on CUDA (the
        device-to-host copies then run asynchronously at full PCIe speed); False
        before the first async save, after :meth:`close`, and for CPU-only state.
        """
        return self._saves.saver.staging.pinned

    def close(self) -> None:
        """Finish the async save in flight and free the staging buffer.

        Background replication is not waited for: :meth:`wait_replicated` does that.
        A failed async save's error stays with its handle; ``close`` does not raise it.
        """
        self._saves.saver.close()

    def __enter__(self) -> Self:
        """``with Checkpointer(...) as ckpt:`` closes it on the way out (see :meth:`close`)."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    # --- peer memory -----------------------------------------------------------

    def peer_steps(self) -> list[int]:
        """Steps complete in this node's peer memory, ascending; ``[]`` without ``peers=``.

        :meth:`steps` lists the store only (retention, ``load(step=N)`` and
        replication work from it); a transient or routine save that went to peer
        memory only is listed here. This node's area alone, read locally (no
        collective): whether every rank's file is held on some node is what
        ``load()`` finds out, and ``mouthguard ls --peers`` shows across areas.
        """
        if self.peers is None:
            return []
        return self.peers.area.complete_steps(self.run)

    # --- load ------------------------------------------------------------------

    def load(
        self,
        step: int | None = None,
        into: object = None,
        *,
        at_or_before: int | None = None,
        device: Any = None,
        check: Check | None = None,
    ) -> LoadedCheckpoint:
        """Load a checkpoint, verifying every byte (and, with ``check``, its state).

        Args:
            step: the step to load exactly; ``None`` loads the newest *valid*
                checkpoint, falling back past damaged ones and ones marked suspect
                with a :class:`CheckpointFallbackWarning`.
            at_or_before: with ``step=None``, the newest valid checkpoint whose step
                is at most this one -- the resume a trainer asks for when it names a
                step: that step, or when it is damaged, suspect, gone or unloadable
                here, the newest valid one before it (never a newer one), with a
                :class:`CheckpointFallbackWarning` saying ``falling back to step N``
                and why. A candidate deleted while the load walks back (a retention
                pass, another trainer's top-k) is passed over like a missing one.
            into: optional state whose tensors (matched by key path, same dtype and
                shape) are filled in place and returned instead of new tensors. If
                every candidate fails, their contents are undefined. Tensors on a
                GPU are filled there directly, through a small ring of pinned host
                buffers (reads, checksum and copies overlap).
            device: where tensors that ``into`` does not give are created
                (``"cuda"``, ``torch.device(...)``; default: the CPU), the same way.
            check: a semantic check run on the loaded state before it is returned
                (:mod:`mouthguard.checks`: ``finite()``, ``reference(...)``, or any
                callable taking a :class:`~mouthguard.checks.CheckInput`
                and returning None or why the state is wrong). A checkpoint that
                fails it is marked suspect in the store's facts (``ls``, ``show``)
                and, with ``step=None``, the load falls back to the next older one;
                one that passes is recorded, and retention keeps the newest such.

        Raises:
            ValueError: ``device`` names no device, or both ``step`` and
                ``at_or_before`` are given.
            CheckpointNotFoundError: nothing is committed (for ``step``, at or before
                ``at_or_before``, or at all).
            CorruptCheckpointError: every copy of the requested ``step`` is damaged.
            NoValidCheckpointError: ``step=None`` and no checkpoint (at or before
                ``at_or_before``) is valid.
            SuspectCheckpointError: the requested ``step`` failed ``check``.
            StateMismatchError: ``into`` does not fit the checkpoint, or it was saved
                by a different number of ranks (``mouthguard.dcp`` reshards).

        Multi-rank: a collective; every rank loads its own rank's state, and a
        checkpoint counts as valid only if every rank could load its part.
        """
        listed = self._load_candidates(step, at_or_before)
        target = target_device(device)
        loader = Loader(self.store, self.run, self.ranks, self.manifest_keys, target, check)
        if step is None and at_or_before is None:
            from_peers = self._load_from_peers(loader, listed, into)
            if from_peers is not None:
                self._lineage.loaded(self.run, from_peers.step, from_peers.info.created)
                return from_peers
        rejected: builtins.list[Rejection] = []
        try:
            loaded = loader.first_valid(
                [int(str(c)) for c in listed], step, into, rejected, at_or_before=at_or_before
            )
            if at_or_before is not None and loaded.step != at_or_before:
                warn_fell_back(self.run, at_or_before, loaded)
            self._lineage.loaded(self.run, loaded.step, loaded.info.created)
            return loaded
        finally:
            # Repairs start only once this load is done reading: a repair racing it
            # could set aside a copy the load is about to try.
            listener = self._listener() if rejected else None
            if listener is not None:
                for damaged in sorted({r.step for r in rejected}):
                    listener.request_repair(self.run, damaged)

    def _load_candidates(self, step: int | None, at_or_before: int | None) -> builtins.list[Any]:
        """The steps :meth:`load` tries, newest first, as the coordinator listed them.

        Every rank walks the coordinator's list, so all try the same steps in order.

        Raises:
            ValueError: both ``step`` and ``at_or_before``, or a step that is no step.
        """
        if step is not None:
            catalog.validate_step(step)
            if at_or_before is not None:
                raise ValueError("give step (exactly that one) or at_or_before, not both")
        if at_or_before is not None:
            catalog.validate_step(at_or_before)
        if step is not None:
            candidates = [step]
        else:
            bound = at_or_before
            candidates = sorted(
                (s for s in self.steps() if bound is None or s <= bound), reverse=True
            )
        listed = self.ranks.broadcast(list(candidates))
        assert isinstance(listed, list)
        return listed

    def _load_from_peers(
        self, loader: Loader, listed: builtins.list[Any], into: object
    ) -> LoadedCheckpoint | None:
        """The newest step in peer memory when it is at least the store's newest, else None."""
        if self.peers is None:
            return None
        newest = max((int(str(c)) for c in listed), default=None)
        return resume_from_peers(self.peers, loader, newest, into)

    # --- housekeeping ----------------------------------------------------------

    def collect_garbage(
        self, *, grace_seconds: float = DEFAULT_GRACE_SECONDS
    ) -> builtins.list[catalog.GarbageReport]:
        """Remove leftovers of interrupted saves older than ``grace_seconds``, per tier."""
        return [
            catalog.collect_partial_saves(tier, self.run, grace_seconds=grace_seconds)
            for tier in self.store.tiers
        ]
