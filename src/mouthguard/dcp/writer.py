"""``Writer``: a ``torch.distributed.checkpoint`` StorageWriter that saves through mouthguard.

``dcp.save(state_dict, storage_writer=Writer(store, run="r", step=100))`` (or
``dcp.async_save``) produces an ordinary mouthguard checkpoint: one safetensors
rank file per rank plus ``manifest.json`` written last, so ``Checkpointer.list``,
``info``, ``mouthguard verify``, the replicator and retention all see it. Files
per checkpoint: ``world_size + 1``.

Call order (DCP's, with what each step does here)::

    0. (all ranks)   reset(checkpoint_id)      only when dcp.save got a checkpoint_id:
                                               "<run>/<step>" retargets the writer
    1. (all ranks)   set_up_storage_writer(is_coordinator, rank=, use_collectives=)
    2. (all ranks)   prepare_local_plan(plan)  refuses dtypes safetensors cannot carry,
                                               before any byte is written
    3. (coordinator) prepare_global_plan(plans)
                                               refuses a step already committed (a damaged
                                               one is set aside), picks the transaction id
                                               and gives plan i storage_data naming it and
                                               rank i (as FileSystemWriter passes prefixes)
    4. (all ranks)   write_data(plan, planner) streams ONE rank file into the shared
                                               staging prefix, checksummed inline
    5. (coordinator) finish(metadata, results) checks the set is complete, writes the
                                               manifest last: the commit

The commit protocol is the Checkpointer's, through the same code
(:mod:`mouthguard.checkpoint.commit`: ``clear_the_way`` in step 3,
``commit_staged`` and ``after_commit`` in step 5): on POSIX tiers every rank
writes into ``<run>/<step>.partial-<txn>/`` and the coordinator's manifest is
followed by the rename to ``<run>/<step>/``; on object stores the manifest's
create-only put under the final prefix is the commit.

Failure: DCP gathers every rank's ``write_data`` outcome before ``finish``; if any
rank failed, ``finish`` is never called and DCP raises on every rank. ``finish``
itself refuses to commit unless every rank 0..world_size-1 reported its rank file
under this transaction and every chunk of the metadata has a stored location, and
(with several ranks) it checks each file's size on the tier. So a failed save
commits nothing: a failure in ``finish`` removes this transaction's staging, and
one before it leaves a partial directory (or, on object stores, objects without
a manifest) that ``Checkpointer.collect_garbage`` removes after its grace period.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future
from typing_extensions import override

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.commit import after_commit, clear_the_way, commit_staged
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.checkpoint.writer import framework_versions, staging_prefix, utc_now
from mouthguard.dcp.ids import parse_checkpoint_id
from mouthguard.dcp.metadata_json import StoredItem, decode_metadata, encode_metadata
from mouthguard.dcp.rank_file import item_dtype, write_items
from mouthguard.errors import CheckpointError
from mouthguard.format import typed_json
from mouthguard.format.manifest import FileRecord, Manifest, TensorRecord
from mouthguard.format.typed_json import JsonValue
from mouthguard.policy.importance import Importance, parse_importance

log = logging.getLogger(__name__)

#: The fqn of the extra WriteResult each rank returns for its rank file.
RANK_FILE_FQN = "\x00mouthguard.rank_file"


@dataclasses.dataclass(frozen=True)
class SaveTarget:
    """``SavePlan.storage_data`` from the coordinator: where rank ``rank`` writes."""

    txn: str
    rank: int
    world_size: int


@dataclasses.dataclass(frozen=True)
class RankFileResult:
    """``storage_data`` of the WriteResult that reports a rank's file to the coordinator."""

    txn: str
    rank: int
    file: FileRecord
    tensors: tuple[TensorRecord, ...]


class Writer(StorageWriter):
    """A DCP StorageWriter committing checkpoint ``step`` of ``run`` to the store's fast tier.

    Args:
        store: a :class:`Store`, or a path accepted by :func:`open_store`.
        run: the run's name (a safe path segment).
        step: the step to save (unique within the run).
        importance: recorded in the manifest like ``Checkpointer.save``'s.
        with_sha256: also record sha256 of every file (tamper evidence, slower).
        reference: optional values (e.g. ``{"loss": 2.3}``) stored in the manifest.
        background: after the commit, tell the store's listener -- this process's
            background replication, started if needed -- as ``Checkpointer`` does;
            default: when the store has more than one tier. Off, replication is
            left to ``mouthguard agent``.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        *,
        run: str,
        step: int,
        importance: str | Importance = "routine",
        with_sha256: bool = False,
        reference: Mapping[str, object] | None = None,
        background: bool | None = None,
    ) -> None:
        super().__init__()
        self.store = store if isinstance(store, Store) else open_store(store)
        self.run = catalog.validate_run(run)
        catalog.validate_step(step)
        self.step = step
        self.importance = parse_importance(importance)
        self.with_sha256 = with_sha256
        self.reference: JsonValue = (
            None if reference is None else typed_json.encode(dict(reference), root="reference")
        )
        self.background = len(self.store.tiers) > 1 if background is None else background
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.rank: int | None = None
        self._target: SaveTarget | None = None  # the coordinator's own transaction

    # --- identity ----------------------------------------------------------------

    @property
    def checkpoint_id(self) -> str:
        """``<run>/<step:012d>``: the checkpoint this writer saves."""
        return f"{self.run}/{catalog.step_dir(self.step)}"

    @override
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` is a ``<run>/<step>`` id this writer accepts."""
        try:
            _, step = parse_checkpoint_id(checkpoint_id)
        except ValueError:
            return False
        return step is not None

    @override
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save; ``checkpoint_id`` (``<run>/<step>``) retargets the writer."""
        if checkpoint_id is not None:
            run, step = parse_checkpoint_id(checkpoint_id)
            if step is None:
                raise ValueError(f"checkpoint_id {checkpoint_id!r} names no step")
            self.run, self.step = run, step
        self.save_id = uuid.uuid4().hex
        self._target = None

    @override
    def storage_meta(self) -> StorageMeta | None:
        """Recorded in the metadata: which checkpoint and which save attempt."""
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    # --- planning ----------------------------------------------------------------

    @override
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record this rank's role. ``use_collectives=False`` is refused.

        Without collectives there is no coordinator to commit one manifest for
        every rank, and per-rank manifests would break the format's one commit
        record per checkpoint.
        """
        del args
        if not kwargs.get("use_collectives", True):
            raise CheckpointError("mouthguard.dcp.Writer needs use_collectives=True")
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = rank if isinstance(rank, int) else None
        self._target = None

    @override
    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Refuse what cannot be stored before any rank writes a byte."""
        for item in plan.items:
            item_dtype(item)
        return plan

    @override
    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Choose the shared transaction and tell every rank its file (coordinator only).

        Raises:
            CheckpointExistsError: the step is already committed and valid.
        """
        # A valid committed step is refused; a damaged one is set aside (as save() does).
        target = SaveTarget(clear_the_way(self.store.fast, self.run, self.step), 0, len(plans))
        self._target = target
        return [
            dataclasses.replace(plan, storage_data=dataclasses.replace(target, rank=rank))
            for rank, plan in enumerate(plans)
        ]

    # --- writing -----------------------------------------------------------------

    @override
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stream this rank's items into ONE rank file in the shared staging prefix.

        Returns one WriteResult per item (``storage_data``: a :class:`StoredItem`)
        and one more, with fqn :data:`RANK_FILE_FQN`, reporting the file itself to
        the coordinator (a rank with no items still writes and reports a file:
        the format has one file per rank).
        """
        target = plan.storage_data
        if not isinstance(target, SaveTarget):
            raise CheckpointError("the save plan carries no mouthguard target (no global plan?)")
        if self.rank is not None and self.rank != target.rank:
            raise CheckpointError(f"rank {self.rank} was handed the plan of rank {target.rank}")
        tier = self.store.fast
        written = write_items(
            tier,
            staging_prefix(tier, self.run, self.step, target.txn),
            rank=target.rank,
            items=plan.items,
            planner=planner,
            metadata={
                "format": "mouthguard.checkpoint",
                "writer": "mouthguard.dcp",
                "run": self.run,
                "step": str(self.step),
                "rank": str(target.rank),
            },
            with_sha256=self.with_sha256,
        )
        results = [
            WriteResult(index=item.index, size_in_bytes=length, storage_data=stored)
            for item, stored, length in written.items
        ]
        report = RankFileResult(target.txn, target.rank, written.file, written.tensors)
        results.append(
            WriteResult(MetadataIndex(RANK_FILE_FQN), written.file.size, storage_data=report)
        )
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    # --- commit ------------------------------------------------------------------

    @override
    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: check the set is complete, then write the manifest last (coordinator).

        Raises:
            CheckpointError: a rank's file or an item's location is missing or
                belongs to another transaction: nothing is committed.
            CheckpointExistsError: another writer committed the step meanwhile.
        """
        target = self._target
        if not self.is_coordinator or target is None:
            raise CheckpointError("finish() runs on the coordinator after prepare_global_plan()")
        self._target = None  # one finish per transaction, whatever happens
        tier = self.store.fast
        manifest, _raw = commit_staged(
            tier,
            self.run,
            self.step,
            staging_prefix(tier, self.run, self.step, target.txn),
            target.world_size,
            lambda: self._manifest(metadata, results, target),
            # Never commit what a reader would reject: the reader's checks, before the
            # commit (this also proves every chunk of the metadata has a stored location).
            validate=lambda parsed: decode_metadata(parsed.dcp, parsed),
        )
        log.info("committed DCP checkpoint %s step %d", self.run, self.step)
        after_commit(tier, manifest, self.store.listener() if self.background else None)

    def _manifest(
        self, metadata: Metadata, results: list[list[WriteResult]], target: SaveTarget
    ) -> Manifest:
        files, tensors, stored = _collect(results, target)
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = stored
        metadata.storage_meta = self.storage_meta()
        return Manifest(
            run=self.run,
            step=self.step,
            importance=self.importance,
            created=utc_now(),
            world_size=target.world_size,
            files=files,
            tensors=tensors,
            states=tuple({} for _ in files),
            framework=framework_versions(),
            reference=self.reference,
            dcp=encode_metadata(metadata),
        )


def _collect(
    results: list[list[WriteResult]], target: SaveTarget
) -> tuple[tuple[FileRecord, ...], tuple[TensorRecord, ...], dict[MetadataIndex, StoredItem]]:
    """Split the ranks' results into rank files and item locations; refuse a partial set."""
    reports: dict[int, RankFileResult] = {}
    stored: dict[MetadataIndex, StoredItem] = {}
    for rank_results in results:
        for result in rank_results:
            data = result.storage_data
            if isinstance(data, RankFileResult):
                if data.txn != target.txn or data.rank in reports:
                    raise CheckpointError(
                        f"rank file of rank {data.rank} is stale or reported twice: not committing"
                    )
                reports[data.rank] = data
            elif isinstance(data, StoredItem):
                if result.index in stored:
                    raise CheckpointError(f"DCP item {result.index} was written twice")
                stored[result.index] = data
            else:
                raise CheckpointError(f"unexpected write result for {result.index.fqn!r}")
    missing = sorted(set(range(target.world_size)) - set(reports))
    if missing or len(reports) != target.world_size:
        raise CheckpointError(f"ranks {missing} reported no rank file: not committing")
    ordered = [reports[rank] for rank in range(target.world_size)]
    files = tuple(r.file for r in ordered)
    tensors = tuple(t for r in ordered for t in r.tensors)
    return files, tensors, stored
