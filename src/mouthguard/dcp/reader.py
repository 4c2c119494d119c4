"""``Reader``: a ``torch.distributed.checkpoint`` StorageReader over mouthguard checkpoints.

``dcp.load(state_dict, storage_reader=Reader(store, run="r"))`` loads the newest
valid DCP checkpoint of the run into ``state_dict`` with DCP's resharding: a
checkpoint saved by 2 ranks loads into 4, or into 1. Every byte read is
verified: each stored chunk is read whole, checked against its own xxh3-128 from
the (self-checksummed) metadata, and only then narrowed to the requested region
and copied into the planner's tensor. A mismatch raises
:class:`~mouthguard.errors.ChecksumMismatchError` naming the item -- after the
other tiers' byte-identical copies were tried, each rejection warned about with a
:class:`~mouthguard.errors.CheckpointFallbackWarning` and reported for repair.

Call order (DCP's, with what each step does here)::

    0. (all ranks)   reset(checkpoint_id)        only when dcp.load got a checkpoint_id:
                                                 "<run>" or "<run>/<step>" retargets
    1. (all ranks)   read_metadata()             resolves the checkpoint (resolve.py) and
                                                 rebuilds DCP's Metadata from JSON, validated
                                                 as hostile input; no pickle
    2. (all ranks)   set_up_storage_reader(metadata, is_coordinator)
    3. (all ranks)   prepare_local_plan(plan)    stamps the checkpoint this rank resolved
    4. (coordinator) prepare_global_plan(plans)  refuses ranks that resolved different
                                                 checkpoints (a commit landed between their
                                                 read_metadata calls)
    5. (all ranks)   read_data(plan, planner)    reads, verifies, narrows, copies, commits

Bytes items (non-tensor values) are ``torch.save`` output produced by DCP's own
planner, and DCP's ``load_bytes`` unpickles them with ``weights_only=False``. A
checkpoint is data from storage, so by default each bytes item must first load
with torch's restricted ``weights_only=True`` unpickler (plain numbers, strings,
containers, tensors); anything else is refused unless ``trust_bytes_items=True``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future
from typing_extensions import override

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import READ_CHUNK_BYTES
from mouthguard.checkpoint.store import Store, open_store
from mouthguard.dcp.ids import parse_checkpoint_id
from mouthguard.dcp.metadata_json import StoredItem, decode_metadata
from mouthguard.dcp.resolve import Copy, Resolved, report, resolve
from mouthguard.errors import (
    CheckpointError,
    CheckpointFallbackWarning,
    ChecksumMismatchError,
    FormatError,
    ManifestError,
    MouthguardError,
    StateMismatchError,
    is_data_damage,
)
from mouthguard.format.checksum import StreamHasher
from mouthguard.format.dtypes import torch_dtype
from mouthguard.format.rank_file import byte_view


@dataclasses.dataclass(frozen=True)
class LoadTarget:
    """``LoadPlan.storage_data``: the checkpoint a rank resolved (checked by the coordinator)."""

    step: int
    digest: str


def describe(index: MetadataIndex) -> str:
    """An item as error messages name it: ``'model.w' [5, 0]`` or ``'step'``."""
    return repr(index.fqn) + ("" if index.offset is None else f" {list(index.offset)}")


class Reader(StorageReader):
    """A DCP StorageReader for checkpoint ``step`` of ``run`` (None: the newest valid one).

    Args:
        store: a :class:`Store`, or a path accepted by :func:`open_store`.
        run: the run's name.
        step: the step to load; None picks the newest committed DCP checkpoint whose
            manifest is valid, falling back past damaged ones with a warning.
        trust_bytes_items: hand bytes items to DCP's unrestricted unpickler even
            when torch's restricted one refuses them (only for trusted checkpoints).
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        *,
        run: str,
        step: int | None = None,
        trust_bytes_items: bool = False,
    ) -> None:
        super().__init__()
        self.store = store if isinstance(store, Store) else open_store(store, create=False)
        self.run = catalog.validate_run(run)
        if step is not None:
            catalog.validate_step(step)
        self.step = step
        self.trust_bytes_items = trust_bytes_items
        self.load_id = uuid.uuid4().hex
        self._resolved: Resolved | None = None
        self._storage: dict[MetadataIndex, StoredItem] = {}
        self._sizes_checked: set[tuple[str, str]] = set()

    # --- identity ----------------------------------------------------------------

    @property
    def checkpoint_id(self) -> str:
        """``<run>/<step:012d>`` once resolved (or requested), else ``<run>``."""
        step = self._resolved.step if self._resolved is not None else self.step
        return self.run if step is None else f"{self.run}/{catalog.step_dir(step)}"

    @property
    def resolved_step(self) -> int | None:
        """The step this reader loads, once ``read_metadata`` has chosen it."""
        return None if self._resolved is None else self._resolved.step

    @override
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` is ``<run>`` or ``<run>/<step>``."""
        try:
            parse_checkpoint_id(checkpoint_id)
        except ValueError:
            return False
        return True

    @override
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load; ``checkpoint_id`` (``<run>`` or ``<run>/<step>``) retargets."""
        if checkpoint_id is not None:
            self.run, self.step = parse_checkpoint_id(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self._resolved = None
        self._storage = {}
        self._sizes_checked = set()

    # --- metadata and planning ---------------------------------------------------

    def _resolve(self) -> Resolved:
        if self._resolved is None:
            self._resolved = resolve(self.store, self.run, self.step)
        return self._resolved

    @override
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Resolve the checkpoint and rebuild its Metadata (validated; never unpickled).

        DCP retries with ``rank=`` for per-rank metadata after a failure; mouthguard
        has one manifest per checkpoint, so that retry fails with the reason.
        """
        del args
        if kwargs.get("rank") is not None:
            raise CheckpointError("mouthguard DCP checkpoints have no per-rank metadata")
        resolved = self._resolve()
        metadata = decode_metadata(resolved.manifest.dcp, resolved.manifest)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    @override
    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Keep the stored locations of ``metadata`` (as :func:`read_metadata` built them)."""
        del is_coordinator, args, kwargs
        storage = metadata.storage_data
        if not isinstance(storage, dict) or not all(
            isinstance(v, StoredItem) for v in storage.values()
        ):
            raise CheckpointError("metadata was not read by mouthguard.dcp.Reader")
        self._storage = storage
        self._resolve()

    @override
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Stamp the plan with the checkpoint this rank resolved."""
        resolved = self._resolve()
        return dataclasses.replace(plan, storage_data=LoadTarget(resolved.step, resolved.digest))

    @override
    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Refuse a load whose ranks resolved different checkpoints (coordinator only)."""
        targets = {p.storage_data for p in plans}
        if len(targets) != 1 or not isinstance(next(iter(targets)), LoadTarget):
            steps = sorted({t.step for t in targets if isinstance(t, LoadTarget)})
            raise CheckpointError(
                f"ranks resolved different checkpoints of {self.run} (steps {steps}): "
                "a save committed during the load; retry, or pass step="
            )
        return plans

    # --- reading -----------------------------------------------------------------

    @override
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read each stored chunk once, verify it, and serve every request on it."""
        groups: dict[MetadataIndex, list[ReadItem]] = {}
        for request in plan.items:
            groups.setdefault(request.storage_index, []).append(request)
        for index, requests in groups.items():
            stored = self._storage.get(index)
            if stored is None:
                raise ManifestError(f"DCP item {describe(index)} has no stored data")
            payload = self._fetch(index, stored)
            for request in requests:
                if request.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(request, io.BytesIO(self._bytes(index, payload)))
                else:
                    self._serve_tensor(planner, request, payload)
            del payload  # one stored chunk in memory at a time
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _bytes(self, index: MetadataIndex, payload: torch.Tensor) -> bytes:
        data = bytes(byte_view(payload))
        if not self.trust_bytes_items:
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any refusal of the restricted unpickler
                raise FormatError(
                    f"DCP bytes item {describe(index)} does not load with weights_only=True "
                    f"({type(exc).__name__}); pass trust_bytes_items=True only if you trust "
                    "this checkpoint"
                ) from None
        return data

    def _serve_tensor(self, planner: LoadPlanner, request: ReadItem, chunk: torch.Tensor) -> None:
        piece = _narrow(chunk, request.storage_offsets, request.lengths, request.storage_index)
        target = planner.resolve_tensor(request).detach()
        if target.size() != piece.size() or target.dtype != piece.dtype:
            raise StateMismatchError(
                f"DCP item {describe(request.storage_index)}: stored {piece.dtype} "
                f"{list(piece.size())}, the state dict wants {target.dtype} {list(target.size())}"
            )
        target.copy_(piece)
        planner.commit_tensor(request, target)

    def _fetch(self, index: MetadataIndex, stored: StoredItem) -> torch.Tensor:
        """The whole stored chunk, verified, from the first copy that has it intact."""
        copies = self._resolve().copies
        first: MouthguardError | None = None
        for position, copy in enumerate(copies):
            try:
                return self._read_item(copy, index, stored)
            except MouthguardError as exc:
                first = first or exc
                resolved = self._resolve()
                if is_data_damage(exc):
                    report(copy.tier, resolved.run, resolved.step, str(exc))
                if position + 1 < len(copies):
                    warnings.warn(
                        f"{exc}; reading it from tier {copies[position + 1].tier.name!r}",
                        CheckpointFallbackWarning,
                        stacklevel=4,
                    )
        assert first is not None  # a resolved checkpoint has at least one copy
        raise first

    def _read_item(self, copy: Copy, index: MetadataIndex, stored: StoredItem) -> torch.Tensor:
        record = copy.records.get((stored.file, stored.tensor))
        if record is None:  # decode_metadata checked it; kept for a forged storage_data
            raise ManifestError(f"DCP item {describe(index)}: {stored.tensor!r} not stored")
        key = copy.prefix + stored.file
        if (copy.tier.name, key) not in self._sizes_checked:
            expected = copy.manifest.file(stored.file).size
            size = copy.tier.head(key).size
            if size != expected:
                raise ChecksumMismatchError(
                    f"{stored.file} on tier {copy.tier.name!r}: size is {size} bytes, manifest "
                    f"says {expected} (truncated, extended or replaced)"
                )
            self._sizes_checked.add((copy.tier.name, key))
        chunk = torch.empty(record.shape, dtype=torch_dtype(record.dtype))
        view = byte_view(chunk)
        hasher = StreamHasher()
        for start in range(0, view.nbytes, READ_CHUNK_BYTES):
            part = view[start : start + READ_CHUNK_BYTES]
            copy.tier.read_into(key, record.offset + start, part)
            hasher.update(part)
        if hasher.xxh3 != stored.checksum:
            raise ChecksumMismatchError(
                f"DCP item {describe(index)} in {stored.file} on tier {copy.tier.name!r}: "
                f"checksum mismatch (metadata {stored.checksum}, read {hasher.xxh3})"
            )
        return chunk


def _narrow(
    chunk: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int], index: MetadataIndex
) -> torch.Tensor:
    """The region ``offsets``/``lengths`` of a stored chunk (as FileSystemReader narrows)."""
    if len(offsets) != chunk.dim() or len(lengths) != chunk.dim():
        raise StateMismatchError(f"DCP item {describe(index)}: request does not fit the chunk")
    piece = chunk
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if start < 0 or length < 0 or start + length > chunk.shape[dim]:
            raise StateMismatchError(
                f"DCP item {describe(index)}: request [{start}, {start + length}) lies outside "
                f"dimension {dim} of the stored chunk ({chunk.shape[dim]})"
            )
        piece = piece.narrow(dim, start, length)
    return piece
