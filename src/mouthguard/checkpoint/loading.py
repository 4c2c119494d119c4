"""Finding and loading the newest valid checkpoint: copies in tier order, fallback, agreement.

For each candidate step (newest first when no step is asked for, or only those
at or before ``at_or_before``) every copy is tried, fast tier first; a candidate
deleted while the walk is under way is passed over (not damage: nothing is
reported); a copy that fails verification is reported as damaged
(so the background service confirms and repairs it) and the next copy or the
next older step is tried, with a :class:`CheckpointFallbackWarning` naming what
was wrong.

Multi-rank: every rank loads its own rank's file; after each candidate the
ranks agree (``all_gather``) whether *every* rank loaded it. If one rank's file
is damaged on every tier, all ranks move on to the next older step together, so
a job never resumes from a mix of steps.

Semantic checks (:mod:`~mouthguard.checkpoint.checking`): a fallback load skips
checkpoints already marked suspect; with a ``check``, every rank runs it on its
loaded part, the ranks agree, and a failure marks the checkpoint suspect on
every copy (the coordinator writes) and moves on to the next older step, with a
:class:`CheckpointFallbackWarning` naming the reason; a pass is recorded, so
retention keeps the newest checkpoint a resume proved sound.
"""

from __future__ import annotations

import builtins
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.checking import (
    Check,
    CheckInput,
    agreed_verdicts,
    reference_of,
    saved_suspect,
)
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo, LoadedCheckpoint, Rejection
from mouthguard.checkpoint.mapped_load import Receipt, map_copy
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.reader import load_copy, read_manifest
from mouthguard.checkpoint.sidecars import (
    CopyRef,
    mark_checked,
    mark_suspect,
    read_sidecars,
    report_damage,
)
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.writer import utc_now
from mouthguard.errors import (
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MouthguardError,
    NoValidCheckpointError,
    StateMismatchError,
    SuspectCheckpointError,
    is_data_damage,
)
from mouthguard.format.manifest import Manifest
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.local import LocalTier

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_MISMATCH = "mismatch: "


@dataclass(frozen=True)
class Loader:
    """Loads one run's checkpoints for one rank of ``ranks``."""

    store: Store
    run: str
    ranks: RankGroup
    #: Manifest keys: when set, only validly signed manifests are loaded.
    keys: Keyring | None = None
    #: Where new tensors are created (None: the CPU); see ``reader.load_copy``.
    device: torch.device | None = None
    #: A semantic check run on the loaded state before it is returned.
    check: Check | None = None
    #: Hand out CPU tensors as views of a private mapping of a local tier's file
    #: (:mod:`~mouthguard.checkpoint.mapped_load`) instead of reading them into new
    #: ones. Only for tiers whose files are never rewritten in place (peer memory).
    mapped: bool = False
    #: Manifests already read and validated (with ``keys``) by the caller, by step:
    #: used instead of reading them again (a peer resume parses its step's once),
    #: and the step's files are looked for on every tier of ``store``.
    known: Mapping[int, Manifest] = field(default_factory=dict, hash=False)
    #: Files this process received and verified in this load (peer memory's fetch):
    #: a mapped load does not hash them again (see mapped_load's "verified at receipt").
    received: frozenset[Receipt] = frozenset()
    #: Why this rank already knows its part cannot load (a fetch that failed its
    #: checksum): it still takes part in the load's agreement, as a damaged copy,
    #: so every rank learns of it there rather than in a collective of its own.
    unloadable: str = ""

    def first_valid(
        self,
        candidates: builtins.list[int],
        step: int | None,
        into: object,
        rejected: builtins.list[Rejection],
        *,
        at_or_before: int | None = None,
    ) -> LoadedCheckpoint:
        """The first candidate that every rank loads; raise as ``Checkpointer.load`` documents.

        ``step`` is the one step asked for exactly (no fallback); with ``step=None``
        the candidates are walked newest first, and ``at_or_before`` only names
        their bound in the errors.
        """
        fallback = step is None
        for candidate in candidates:
            if fallback and self._skip_suspect(candidate, rejected):
                continue
            loaded = self._agreed(candidate, into, rejected, fallback=fallback)
            if loaded is not None and self._passes(loaded, rejected, fallback=fallback):
                return loaded
        bound = "" if at_or_before is None else f" at or before step {at_or_before}"
        if not rejected:
            what = f"step {step}" if step is not None else f"any step{bound}"
            raise CheckpointNotFoundError(
                f"run {self.run!r} has no committed checkpoint for {what}"
            )
        reasons = "; ".join(f"step {r.step} on {r.tier}: {r.reason}" for r in rejected)
        if step is not None:
            raise CorruptCheckpointError(
                f"every copy of {self.run} step {step} is damaged: {reasons}"
            )
        raise NoValidCheckpointError(f"run {self.run!r} has no valid checkpoint{bound}: {reasons}")

    def _skip_suspect(self, step: int, rejected: builtins.list[Rejection]) -> bool:
        """Whether ``step`` is marked suspect (the coordinator's reading decides for all)."""
        reason = self._suspect_reason(step) if self.ranks.is_coordinator else ""
        reason = str(self.ranks.broadcast(reason) or "")
        if not reason:
            return False
        rejected.append(Rejection(step, "-", f"suspect: {reason}"))
        warnings.warn(
            f"checkpoint {self.run} step {step} is suspect ({reason}); trying an older checkpoint",
            CheckpointFallbackWarning,
            stacklevel=5,
        )
        return True

    def _suspect_reason(self, step: int) -> str:
        known = self.known.get(step)
        if known is None:
            return suspect_reason(self._tiers_holding(step), self.run, step, self.keys)
        return saved_suspect(known.reference) or marked_suspect(
            self._tiers_holding(step), self.run, step
        )

    def _passes(
        self, loaded: LoadedCheckpoint, rejected: builtins.list[Rejection], *, fallback: bool
    ) -> bool:
        """Run the check on every rank; on failure mark the checkpoint suspect (or raise)."""
        if self.check is None:
            return True
        subject = CheckInput(loaded.step, loaded.state, loaded.reference)
        verdicts = agreed_verdicts(self.check, subject, self.ranks)
        failed = [(rank, v) for rank, v in enumerate(verdicts) if v]
        refs = [CopyRef(t, self.run, loaded.step) for t in self._tiers_holding(loaded.step)]
        if not failed:
            if self.ranks.is_coordinator:
                _record(refs, lambda ref: mark_checked(ref, utc_now()))
            return True
        reason = (
            failed[0][1]
            if len(verdicts) == 1
            else "; ".join(f"rank {rank}: {why}" for rank, why in failed)
        )
        if self.ranks.is_coordinator:
            try:
                with audited("suspect", self.run, loaded.step, [r.tier for r in refs], reason):
                    _record(refs, lambda ref: mark_suspect(ref, reason, utc_now()))
            except MouthguardError as exc:  # best effort, like the mark itself
                log.info("could not record the suspect mark in the audit trail: %s", exc)
        where = f"checkpoint {self.run} step {loaded.step}"
        if not fallback:
            raise SuspectCheckpointError(f"{where} failed the load's check: {reason}")
        rejected.append(Rejection(loaded.step, loaded.tier, f"check failed: {reason}"))
        warnings.warn(
            f"{where} failed the load's check ({reason}): marked suspect; "
            "trying an older checkpoint",
            CheckpointFallbackWarning,
            stacklevel=5,
        )
        return False

    def _agreed(
        self, step: int, into: object, rejected: builtins.list[Rejection], *, fallback: bool
    ) -> LoadedCheckpoint | None:
        """This rank's load of ``step`` if every rank loaded it, else None (or raise)."""
        if self.ranks.world_size == 1:
            return self._load_step(step, into, rejected, fallback=fallback)
        mismatch: StateMismatchError | None = None
        loaded = None
        try:
            loaded = self._load_step(step, into, rejected, fallback=fallback)
            status = "ok" if loaded is not None else "damaged"
        except StateMismatchError as exc:
            mismatch, status = exc, _MISMATCH + str(exc)
        statuses = self.ranks.all_gather(status)
        if mismatch is not None:
            raise mismatch
        for rank, peer in enumerate(statuses):
            if isinstance(peer, str) and peer.startswith(_MISMATCH):
                raise StateMismatchError(f"rank {rank}: {peer[len(_MISMATCH) :]}")
        if all(peer == "ok" for peer in statuses):
            return loaded
        failed = [rank for rank, peer in enumerate(statuses) if peer != "ok"]
        if loaded is not None:
            rejected.append(
                Rejection(step, "-", f"rank(s) {failed} found no valid copy of their part")
            )
        return None

    def _load_step(
        self, step: int, into: object, rejected: builtins.list[Rejection], *, fallback: bool
    ) -> LoadedCheckpoint | None:
        prefix = catalog.checkpoint_prefix(self.run, step)
        if self.unloadable:
            rejected.append(Rejection(step, "-", self.unloadable))
            return None
        for tier in self._tiers_holding(step):
            try:
                manifest = self.known.get(step) or read_manifest(tier, self.run, step, self.keys)
                if not self._loadable(manifest, fallback=fallback):
                    return None
                if self.mapped and isinstance(tier, LocalTier):
                    state = map_copy(
                        tier,
                        prefix,
                        manifest,
                        rank=self.ranks.rank,
                        into=into,
                        device=self.device,
                        received=self.received,
                    )
                else:
                    state = load_copy(
                        tier, prefix, manifest, rank=self.ranks.rank, into=into, device=self.device
                    )
            except StateMismatchError:
                raise
            except MouthguardError as exc:
                if fallback and _deleted(tier, self.run, step):
                    # Retention or another trainer removed it while this load walked
                    # back: not damage (no report, which would recreate its directory).
                    log.info("%s step %d left %s during the load", self.run, step, tier.name)
                    continue
                self._reject(CopyRef(tier, self.run, step), exc, rejected, fallback=fallback)
                continue
            copy = CopyInfo(tier=tier.name, location=tier.location(prefix))
            info = CheckpointInfo.from_manifest(manifest, (copy,))
            return LoadedCheckpoint(
                step, state, info, tier.name, list(rejected), reference_of(manifest.reference)
            )
        return None

    def _loadable(self, manifest: Manifest, *, fallback: bool) -> bool:
        """Whether this job can load ``manifest``: False skips it (only when falling back).

        A checkpoint saved through torch.distributed.checkpoint is ``mouthguard.dcp``'s
        to load; a resume that walks back over it skips it.

        Raises:
            StateMismatchError: asked for explicitly, it cannot be loaded here.
        """
        if manifest.is_dcp:
            if fallback:
                return False
            raise StateMismatchError(
                f"checkpoint {self.run} step {manifest.step} was saved through "
                "torch.distributed.checkpoint: load it with mouthguard.dcp.Reader"
            )
        if manifest.world_size != self.ranks.world_size:
            raise StateMismatchError(
                f"checkpoint {self.run} step {manifest.step} was saved by "
                f"{manifest.world_size} rank(s); this job has {self.ranks.world_size} "
                "(to load with a different number of ranks, save and load through "
                "mouthguard.dcp, which reshards)"
            )
        return True

    def _reject(
        self,
        ref: CopyRef,
        exc: MouthguardError,
        rejected: builtins.list[Rejection],
        *,
        fallback: bool,
    ) -> None:
        rejected.append(Rejection(ref.step, ref.tier.name, str(exc)))
        then = "trying another copy or an older checkpoint" if fallback else "trying another copy"
        where = f"checkpoint {self.run} step {ref.step} on tier {ref.tier.name!r}"
        warnings.warn(f"{where} rejected: {exc}; {then}", CheckpointFallbackWarning, stacklevel=6)
        # The warning is the report. A log line at WARNING would be printed a second time
        # by Python's last-resort handler when the application configured no logging.
        log.info("rejected %s step %d on %s: %s", self.run, ref.step, ref.tier.name, exc)
        if is_data_damage(exc):
            _report_damage(ref, str(exc))

    def _tiers_holding(self, step: int) -> builtins.list[Tier]:
        if step in self.known:
            # The caller holds the validated manifest: the files are looked for on
            # every tier, even one whose manifest is not written yet (a peer resume
            # commits a node's manifest only once every rank loaded its file).
            return builtins.list(self.store.tiers)
        return catalog.tiers_holding(self.store.tiers, self.run, step)


def suspect_reason(tiers: Iterable[Tier], run: str, step: int, keys: Keyring | None = None) -> str:
    """Why ``run``/``step`` is suspect ("" when it is not).

    The save guard's verdict in the manifest, else a suspect mark on any copy
    among ``tiers``. The one reading of the mark: a fallback load skips what this names, and
    ``verify`` prints it next to the copy's byte verdict. A copy that cannot be
    read is passed over (damage is the load's or the verifier's to report).
    """
    readable = []
    for tier in tiers:
        try:
            reason = saved_suspect(read_manifest(tier, run, step, keys).reference)
        except MouthguardError:
            continue
        if reason:
            return reason
        readable.append(tier)
    return marked_suspect(readable, run, step)


def marked_suspect(tiers: Iterable[Tier], run: str, step: int) -> str:
    """The suspect mark on any copy of ``run``/``step`` among ``tiers`` ("" when none).

    :func:`suspect_reason` without the manifest's verdict, for a caller that
    holds the manifest already.
    """
    for tier in tiers:
        try:
            reason = read_sidecars(CopyRef(tier, run, step)).suspect
        except MouthguardError:
            continue
        if reason:
            return reason
    return ""


def _deleted(tier: Tier, run: str, step: int) -> bool:
    """Whether ``run``/``step`` is no longer committed on ``tier`` (False if that is unknown)."""
    try:
        return not tier.exists(catalog.manifest_key(run, step))
    except MouthguardError:
        return False


def _record(refs: builtins.list[CopyRef], write: Callable[[CopyRef], None]) -> None:
    """Write a check's verdict next to every copy; best effort, like a damage report.

    A tier that fails here must not turn a load into an error: the verdict is
    found again by the next load that runs the check.
    """
    for ref in refs:
        try:
            write(ref)
        except MouthguardError as exc:
            log.info("could not record the check verdict on %s: %s", ref, exc)


def _report_damage(ref: CopyRef, reason: str) -> None:
    """Leave a damage report so the replicator confirms and repairs the copy.

    Best effort: a read-only or failing tier must not turn a successful
    fallback into an error.
    """
    try:
        report_damage(ref, reason, utc_now())
    except MouthguardError as exc:
        log.info("could not record the damage of %s: %s", ref, exc)


def target_device(device: Any) -> Any:
    """``load(device=...)`` as a ``torch.device`` (None stays None).

    Raises:
        ValueError: ``device`` names no device.
    """
    if device is None:
        return None
    import torch  # noqa: PLC0415 - torch is loaded by whoever asks for a device

    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{device!r} is not a device: {exc}") from None


def warn_fell_back(run: str, asked: int, loaded: LoadedCheckpoint) -> None:
    """Say, once, that ``load(at_or_before=asked)`` resumed from an older step, and why."""
    why = "; ".join(r.reason for r in loaded.rejected if r.step == asked) or "not committed"
    warnings.warn(
        f"checkpoint {run} step {asked} cannot be loaded ({why}); "
        f"falling back to step {loaded.step}",
        CheckpointFallbackWarning,
        stacklevel=3,
    )
