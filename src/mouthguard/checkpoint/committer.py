"""One save, committed on the fast tier: every rank's file, then the coordinator's manifest.

The protocol, identical for one rank and for N (with one rank the collectives
are the identity)::

    coordinator: clear the way (a damaged old copy of the step is set aside,
                 a valid one refuses the save); choose the transaction id
    broadcast    the decision -> every rank raises or knows the staging prefix
    every rank:  write its own rank file into the staging prefix (in parallel)
    all_gather   each rank's file record, tensor records and state skeleton, or
                 its error
    coordinator: if every rank succeeded and every rank file is visible to it,
                 write the manifest (last) and publish (rename / create-only put);
                 otherwise remove what was staged
    broadcast    the committed manifest's bytes, or the error

So a checkpoint is committed only when every rank's file is written, durable and
listed in the manifest; if any rank fails, nothing is committed and every rank
raises (the failing rank its own exception, the others :class:`RankFailedError`
naming it). The tier must be shared by all ranks (a parallel filesystem or an
object store); a rank file the coordinator cannot see fails the save.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.quarantine import SetAside, set_aside_confirmed
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.checkpoint.writer import (
    commit_bytes,
    framework_versions,
    new_transaction_id,
    staging_prefix,
    utc_now,
)
from mouthguard.errors import (
    CheckpointExistsError,
    MouthguardError,
    ObjectExistsError,
    ObjectNotFoundError,
    RankFailedError,
    TierError,
)
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)

#: Writes this rank's file into a staging prefix; returns its manifest records.
RankWriter = Callable[[str], tuple[FileRecord, list[TensorRecord]]]


@dataclass(frozen=True)
class SaveRequest:
    """What one save commits, besides the tensor bytes."""

    run: str
    step: int
    importance: Importance
    skeleton: JsonValue
    reference: JsonValue = None
    #: Manifest signing keys (the coordinator signs the manifest with the current one).
    signing: Keyring | None = None


def save_copy(
    tier: Tier, request: SaveRequest, write_rank: RankWriter, ranks: RankGroup
) -> Manifest:
    """Write and commit one checkpoint on ``tier`` (see the module docstring).

    Raises:
        CheckpointExistsError: the step is committed and valid (or another writer
            committed it meanwhile).
        RankFailedError: another rank failed (this rank did not).
        MouthguardError: this rank's own failure, unchanged.
    """
    final = catalog.checkpoint_prefix(request.run, request.step)
    txn = _agree(ranks, lambda: clear_the_way(tier, request.run, request.step))
    staging = staging_prefix(tier, request.run, request.step, str(txn))
    try:
        records = _gather(ranks, lambda: _records_json(write_rank(staging), request.skeleton))
    except (ObjectExistsError, CheckpointExistsError):
        # Another writer holds this step: on tiers without rename its objects sit
        # where ours would, so only a private staging directory may be removed.
        if ranks.is_coordinator and staging != final:
            remove_quietly(tier, staging)
        raise CheckpointExistsError(
            f"checkpoint {request.run} step {request.step} was committed by another writer"
        ) from None
    except BaseException:
        if ranks.is_coordinator:
            discard_staged(tier, request.run, request.step, staging, ranks.world_size)
        raise
    committed: list[Manifest] = []

    def commit() -> JsonValue:
        manifest, raw = _commit(tier, request, staging, final, records, ranks.world_size)
        committed.append(manifest)
        # The peers get the exact bytes (and parse them); one rank needs nothing more.
        return raw.decode() if ranks.world_size > 1 else None

    manifest_text = _agree(ranks, commit)
    if committed:  # the coordinator: already parsed and validated before the commit
        return committed[0]
    assert isinstance(manifest_text, str)
    return Manifest.from_bytes(manifest_text.encode())


def _agree(ranks: RankGroup, decide: Callable[[], JsonValue]) -> JsonValue:
    """Run ``decide`` on the coordinator and give every rank its value or its error."""
    own: BaseException | None = None
    payload: JsonValue = None
    if ranks.is_coordinator:
        try:
            payload = {"value": decide()}
        except Exception as exc:  # noqa: BLE001 - every failure must reach the peers, or they hang
            own, payload = exc, _error_json(exc, ranks.rank)
    decided = ranks.broadcast(payload)
    if own is not None:
        raise own
    assert isinstance(decided, dict)
    if "error" in decided:
        raise _peer_error(decided)
    return decided["value"]


def _gather(ranks: RankGroup, produce: Callable[[], JsonValue]) -> list[JsonValue]:
    """Run ``produce`` on every rank; every rank gets all values, or raises."""
    own: BaseException | None = None
    try:
        payload: JsonValue = {"value": produce()}
    except Exception as exc:  # noqa: BLE001 - every failure must reach the peers, or they hang
        own, payload = exc, _error_json(exc, ranks.rank)
    gathered = ranks.all_gather(payload)
    if own is not None:
        raise own
    for item in gathered:
        assert isinstance(item, dict)
        if "error" in item:
            raise _peer_error(item)
    return [item["value"] for item in gathered if isinstance(item, dict)]


def _error_json(exc: Exception, rank: int) -> JsonValue:
    return {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__, "rank": rank}


def _peer_error(payload: dict[str, JsonValue]) -> MouthguardError:
    """The exception a rank raises for a peer's failure (same class where it matters)."""
    message = f"rank {payload.get('rank')} failed: {payload.get('error')}"
    if payload.get("type") in (CheckpointExistsError.__name__, ObjectExistsError.__name__):
        return CheckpointExistsError(message)
    return RankFailedError(message + "; nothing was committed")


def clear_the_way(tier: Tier, run: str, step: int) -> str:
    """Refuse a valid existing ``step``, set a damaged one aside; return a new txn id.

    A resumed run that fell back past a damaged checkpoint saves that step again:
    the damaged copy is moved out of the way (bytes kept for inspection) once a
    second read confirms the damage, so the new save can commit.

    Raises:
        CheckpointExistsError: the step is committed and reads back intact.
        TierError: the existing copy cannot be read now (timeout, dead store):
            nothing is touched and nothing is saved.
    """
    if tier.exists(catalog.manifest_key(run, step)):
        ref = CopyRef(tier, run, step)
        verdict = verify_and_record(ref)
        if verdict.ok:
            raise CheckpointExistsError(f"checkpoint {run} step {step} already exists")
        if not verdict.damaged:
            raise TierError(
                f"cannot save {run} step {step}: the copy already committed on "
                f"{tier.name!r} cannot be verified now ({verdict.reason}); it was left as it is"
            )
        if set_aside_confirmed(ref, verdict.reason) is SetAside.NOT_CONFIRMED:
            raise CheckpointExistsError(
                f"checkpoint {run} step {step} already exists (a second read found it intact)"
            )
    return new_transaction_id()


def _records_json(written: tuple[FileRecord, list[TensorRecord]], skeleton: JsonValue) -> JsonValue:
    record, tensors = written
    return {
        "file": [
            record.name,
            record.rank,
            record.size,
            record.data_offset,
            record.checksum,
            record.sha256,
        ],
        "tensors": [[t.name, t.file, t.dtype, list(t.shape), t.offset, t.length] for t in tensors],
        "state": skeleton,
    }


def _records_from_json(value: JsonValue) -> tuple[FileRecord, list[TensorRecord], JsonValue]:
    """Rebuild one rank's records; the manifest parser validates them again on commit."""
    assert isinstance(value, dict)
    name, rank, size, data_offset, checksum, sha256 = value["file"]  # type: ignore[misc,str-unpack]
    record = FileRecord(name, rank, size, data_offset, checksum, sha256)  # type: ignore[arg-type]
    tensors = [
        TensorRecord(t[0], t[1], t[2], tuple(t[3]), t[4], t[5])  # type: ignore[arg-type,index]
        for t in value["tensors"]  # type: ignore[union-attr]
    ]
    return record, tensors, value["state"]


def _commit(  # noqa: PLR0917 - private; one call site, all arguments distinct
    tier: Tier,
    request: SaveRequest,
    staging: str,
    final: str,
    gathered: list[JsonValue],
    world_size: int,
) -> tuple[Manifest, bytes]:
    """Coordinator: write the manifest over every rank's records and publish it.

    Returns the committed manifest, parsed from its exact bytes, and those bytes.
    """
    try:
        ranks = [_records_from_json(value) for value in gathered]
        if world_size > 1:
            _check_visible(tier, staging, [record for record, _t, _s in ranks])
        manifest = Manifest(
            run=request.run,
            step=request.step,
            importance=request.importance,
            created=utc_now(),
            world_size=world_size,
            files=tuple(record for record, _t, _s in ranks),
            tensors=tuple(t for _r, tensors, _s in ranks for t in tensors),
            states=tuple(state for _r, _t, state in ranks),
            framework=framework_versions(),
            reference=request.reference,
        )
        raw = manifest.to_bytes(request.signing)
        parsed = Manifest.from_bytes(raw)  # peers' records are validated before the commit
        commit_bytes(tier, staging, final, raw)
    except (ObjectExistsError, CheckpointExistsError):
        # Another writer committed (or is committing) this step: on tiers without
        # rename our objects sit next to theirs, so nothing may be cleaned up here.
        if staging != final:
            remove_quietly(tier, staging)
        raise CheckpointExistsError(
            f"checkpoint {request.run} step {request.step} was committed by another writer"
        ) from None
    except BaseException:
        discard_staged(tier, request.run, request.step, staging, world_size)
        raise
    return parsed, raw


def _check_visible(tier: Tier, staging: str, records: list[FileRecord]) -> None:
    """Every rank file is visible to the coordinator with its size, or the save fails.

    A rank file the coordinator cannot see means the tier is not shared by all
    ranks: committing a manifest over it would be a lie.
    """
    for record in records:
        try:
            size: int | None = tier.head(staging + record.name).size
        except ObjectNotFoundError:
            size = None
        if size != record.size:
            raise TierError(
                f"{record.name} is not visible with its size on tier {tier.name!r} "
                "from the coordinator: is the tier shared by every rank?"
            )


def discard_staged(tier: Tier, run: str, step: int, staging: str, world_size: int) -> None:
    """Remove what a failed save staged, leaving any committed checkpoint alone."""
    final = catalog.checkpoint_prefix(run, step)
    if staging != final:
        remove_quietly(tier, staging)
    elif not tier.exists(catalog.manifest_key(run, step)):
        # No rename (object stores): remove our own uncommitted rank files so a
        # retry of this step is not blocked by them.
        for rank in range(world_size):
            remove_key_quietly(tier, final + catalog.rank_file_name(rank))


def remove_key_quietly(tier: Tier, key: str) -> None:
    """Best-effort removal of one object of a failed save."""
    try:
        tier.delete(key)
    except MouthguardError as exc:
        log.warning("could not remove %s on %s: %s", key, tier.name, exc)


def remove_quietly(tier: Tier, prefix: str) -> None:
    """Best-effort cleanup of a failed save; the original error is what matters."""
    try:
        tier.delete_prefix(prefix)
    except MouthguardError as exc:
        log.warning("could not remove partial save %s on %s: %s", prefix, tier.name, exc)
