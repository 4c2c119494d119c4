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

The coordinator's steps -- clearing the way, writing the manifest, cleaning up a
failed save, what follows a commit -- are :mod:`~mouthguard.checkpoint.commit`'s,
shared with the DCP writer; this module is how the ranks of a ``Checkpointer``
agree around them.

So a checkpoint is committed only when every rank's file is written, durable and
listed in the manifest; if any rank fails, nothing is committed and every rank
raises (the failing rank its own exception, the others :class:`RankFailedError`
naming it). The tier must be shared by all ranks (a parallel filesystem or an
object store); a rank file the coordinator cannot see fails the save.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mouthguard.checkpoint.commit import clear_the_way, commit_staged, discarding_on_failure
from mouthguard.checkpoint.ranks import RankGroup
from mouthguard.checkpoint.writer import framework_versions, staging_prefix, utc_now
from mouthguard.errors import (
    CheckpointExistsError,
    MouthguardError,
    ObjectExistsError,
    RankFailedError,
)
from mouthguard.format.lineage import Lineage
from mouthguard.format.manifest import FileRecord, Manifest, SaveTiming, TensorRecord
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring

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
    #: The save's timing as of now, asked for when the coordinator builds the manifest.
    timing: Callable[[], SaveTiming] | None = None
    #: Who saves, for the audit trail (None: ``user@host``).
    actor: str | None = None
    #: What the checkpoint came from, recorded in its manifest.
    lineage: Lineage | None = None


def commit_save(
    tier: Tier, request: SaveRequest, write_rank: RankWriter, ranks: RankGroup
) -> Manifest:
    """Write and commit one checkpoint on ``tier`` (see the module docstring).

    Raises:
        CheckpointExistsError: the step is committed and valid (or another writer
            committed it meanwhile).
        RankFailedError: another rank failed (this rank did not).
        MouthguardError: this rank's own failure, unchanged.
    """
    run, step, world_size = request.run, request.step, ranks.world_size
    txn = agree(ranks, lambda: clear_the_way(tier, run, step))
    staging = staging_prefix(tier, run, step, str(txn))
    with discarding_on_failure(tier, run, step, staging, world_size, clean=ranks.is_coordinator):
        records = gather(ranks, lambda: records_json(write_rank(staging), request.skeleton))
    committed: list[Manifest] = []

    def commit() -> JsonValue:
        manifest, raw = commit_staged(
            tier,
            run,
            step,
            staging,
            world_size,
            lambda: build_manifest(request, records, world_size),
            keys=request.signing,
            actor=request.actor,
        )
        committed.append(manifest)
        # The peers get the exact bytes (and parse them); one rank needs nothing more.
        return raw.decode() if world_size > 1 else None

    manifest_text = agree(ranks, commit)
    if committed:  # the coordinator: already parsed and validated before the commit
        return committed[0]
    assert isinstance(manifest_text, str)
    return Manifest.from_bytes(manifest_text.encode())


def agree(ranks: RankGroup, decide: Callable[[], JsonValue]) -> JsonValue:
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


def gather(ranks: RankGroup, produce: Callable[[], JsonValue]) -> list[JsonValue]:
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


def records_json(written: tuple[FileRecord, list[TensorRecord]], skeleton: JsonValue) -> JsonValue:
    """One rank's file and tensor records and state skeleton, as the ranks exchange them."""
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


def records_from_json(value: JsonValue) -> tuple[FileRecord, list[TensorRecord], JsonValue]:
    """Rebuild one rank's records; the manifest parser validates them again on commit."""
    assert isinstance(value, dict)
    name, rank, size, data_offset, checksum, sha256 = value["file"]  # type: ignore[misc,str-unpack]
    record = FileRecord(name, rank, size, data_offset, checksum, sha256)  # type: ignore[arg-type]
    tensors = [
        TensorRecord(t[0], t[1], t[2], tuple(t[3]), t[4], t[5])  # type: ignore[arg-type,index]
        for t in value["tensors"]  # type: ignore[union-attr]
    ]
    return record, tensors, value["state"]


def build_manifest(request: SaveRequest, gathered: list[JsonValue], world_size: int) -> Manifest:
    """The manifest over every rank's records, in rank order."""
    ranks = [records_from_json(value) for value in gathered]
    return Manifest(
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
        save=None if request.timing is None else request.timing(),
        lineage=request.lineage,
    )
