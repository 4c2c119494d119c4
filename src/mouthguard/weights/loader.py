"""``mouthguard.weights.load``: model weights from storage into device memory, verified.

Order of work for one load::

    open_source(...)                      what to read (index / manifest / single file)
    [localize(...)]                       a remote source through the node-local cache
    per file, ``parallel_files`` at once:
        plan_file(...)                    header checked; this rank's slices; the reads
        allocate the returned tensors     on the target device
        read_file(...) or GDS             reads in flight, checksum inline, ring -> device
    every file verified or reported unverified; tensors returned

Guarantees: a file with a checksum (a mouthguard checkpoint) is returned only if
every byte matched it; a file without one (a Hugging Face directory) is returned
and listed in ``unverified_files``. On any error nothing is returned. Host memory
beyond the returned tensors is bounded by the rings (``parallel_files`` x
(``READS_AHEAD`` + 1) x ``slot_bytes``), never the model's size.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mouthguard.errors import ChecksumMismatchError, WeightsError
from mouthguard.format.dtypes import torch_dtype
from mouthguard.io.host_ring import SLOT_BYTES, HostRing
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.weights.gds import gds_status, read_ranges_gds
from mouthguard.weights.node_cache import localize
from mouthguard.weights.pipeline import READS_AHEAD, needs_ring, read_file
from mouthguard.weights.plan import FilePlan, plan_file
from mouthguard.weights.sharding import TensorParallel
from mouthguard.weights.source import WeightFile, WeightSource, open_source

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Files read at once (each with its own reads in flight and its own ring).
PARALLEL_FILES = 4


@dataclass
class LoadedWeights:
    """What :func:`load` returns.

    Attributes:
        tensors: name -> tensor on the target device (this rank's slice where split).
        source: where the weights came from (a path or URL).
        kind: ``safetensors-index``, ``safetensors`` or ``checkpoint``.
        device: the device the tensors are on.
        nbytes: bytes of the returned tensors.
        bytes_read: bytes read from storage by this load (more than ``nbytes`` when a
            verified file's unwanted bytes had to be read for its checksum).
        downloaded: bytes pulled from a remote source into the cache by this load.
        refreshed_files: cached files that were of an older remote version (the
            object's ETag or size changed) and were downloaded again by this load.
        seconds: the load's wall time, from the call until every tensor is in place,
            not counting the first import of torch in the process.
        verified_files: files whose every byte matched their checksum.
        unverified_files: files without a checksum (or loaded with ``verify=False``).
        gds: whether GPUDirect Storage was used; ``gds_reason`` says why (not).
    """

    tensors: dict[str, torch.Tensor]
    source: str
    kind: str
    device: str
    nbytes: int = 0
    bytes_read: int = 0
    downloaded: int = 0
    refreshed_files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    verified_files: list[str] = field(default_factory=list)
    unverified_files: list[str] = field(default_factory=list)
    gds: bool = False
    gds_reason: str = ""

    @property
    def bytes_per_second(self) -> float:
        """Returned bytes over the load's wall time."""
        return self.nbytes / max(self.seconds, 1e-9)


def load(
    source: str | os.PathLike[str] | Tier,
    device: str | torch.device = "cpu",
    *,
    prefix: str = "",
    run: str | None = None,
    step: int | None = None,
    verify: bool = True,
    tensor_parallel: TensorParallel | None = None,
    include: Sequence[str] | None = None,
    files: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    gds: bool | None = None,
    parallel_files: int = PARALLEL_FILES,
    slot_bytes: int = SLOT_BYTES,
    on_file: Callable[[str, int], None] | None = None,
) -> LoadedWeights:
    """Load model weights from ``source`` into tensors on ``device``.

    Args:
        source: a model directory, a checkpoint directory, a store (with ``run``),
            an ``s3://`` URL, or a tier (see :mod:`mouthguard.weights.source`).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or a ``torch.device``.
        prefix: a key prefix inside ``source`` (for a URL or tier).
        run: load a checkpoint of this run of the store ``source``.
        step: that checkpoint's step (default: the newest committed).
        verify: check every file that has a checksum (default). Off, nothing is
            checked and only the wanted bytes are read.
        tensor_parallel: load only this rank's slice of the tensors its rules match.
        include: ``fnmatch`` patterns of tensor names to load (default: all).
        files: load only these files of the source, by name (a multi-rank
            checkpoint holds each rank's tensors under the same names).
        cache_dir: for a remote source, a local directory the files are copied to
            first and read from on every later load (S3 -> local disk -> device).
        gds: GPUDirect Storage for files that need no verification: None uses it
            when kvikio can (:func:`~mouthguard.weights.gds.gds_status`), False never.
        parallel_files: files read at once.
        slot_bytes: size of each ring slot and of each read.
        on_file: called with each file's name and the bytes read from it once it is
            loaded (from a worker thread; for progress displays).

    Raises:
        WeightsError: nothing loadable at ``source``, a bad split, a missing
            device, or two files holding one tensor name.
        ChecksumMismatchError, RankFileError: damaged bytes (nothing is returned).
        TierError: the storage failed.
    """
    # The device is checked (and torch imported, a one-time cost of the process that
    # a server has paid already) before the clock starts: ``seconds`` is the load's.
    target = _device(device)
    started = time.perf_counter()
    found = open_weights(
        source, prefix=prefix, run=run, step=step, files=files, cache_dir=cache_dir
    )
    use_gds, gds_reason = _gds_choice(gds, target, found.source)
    options = _Options(
        target,
        verify,
        tensor_parallel,
        include,
        use_gds,
        max(1, parallel_files),
        slot_bytes,
        on_file,
    )
    done, found = _read_refetching(found, options)
    opened = found.source
    result = LoadedWeights(
        {}, opened.description, opened.kind, str(target), downloaded=found.downloaded
    )
    result.refreshed_files = list(found.refreshed)
    result.gds, result.gds_reason = use_gds, gds_reason
    _collect(result, done)
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True)
class OpenedWeights:
    """A source recognised and, when remote with a cache, brought up to date in it.

    Attributes:
        remote: the source as given (its tier may be remote).
        source: what to read: ``remote``, or its node-local copy under ``cache``.
        cache: the node cache directory in use, or None.
        downloaded: bytes pulled into the cache by this call.
        refreshed: cached files that were stale (a new ETag or size) and fetched again.
    """

    remote: WeightSource
    source: WeightSource
    cache: Path | None
    downloaded: int = 0
    refreshed: tuple[str, ...] = ()


def open_weights(
    source: str | os.PathLike[str] | Tier,
    *,
    prefix: str = "",
    run: str | None = None,
    step: int | None = None,
    files: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> OpenedWeights:
    """The first steps of every load: recognise ``source``, keep ``files``, localize.

    Arguments as :func:`load`'s. Raises as :func:`load` does before reading tensors.
    """
    remote = open_source(source, prefix=prefix, run=run, step=step)
    if files is not None:
        remote = _only(remote, files)
    remote_tier = not isinstance(remote.tier, LocalTier)
    cache = Path(cache_dir) if cache_dir is not None and remote_tier else None
    if cache is None:
        return OpenedWeights(remote, remote, None)
    local = localize(remote, cache)
    return OpenedWeights(remote, local.source, cache, local.downloaded, tuple(local.refreshed))


def _read_refetching(
    found: OpenedWeights, options: _Options
) -> tuple[list[tuple[FilePlan, list[torch.Tensor], int]], OpenedWeights]:
    """Every file of ``found`` read; a damaged node-local copy is fetched again, once.

    The local copy rotted since it was cached (the remote one was verified when
    downloaded): its damaged files are dropped, :func:`localize` downloads them
    again, and the second read's source and counts are returned with its tensors.

    Raises:
        ChecksumMismatchError: damage where there is no cache to fetch into again,
            or in the copy fetched again.
    """
    damaged: list[WeightFile] = []
    try:
        return _read_all(found.source, options, damaged), found
    except ChecksumMismatchError:
        if found.cache is None or not damaged:
            raise
    for file in damaged:
        log.warning(
            "cached %s of %s is damaged: downloading it again", file.name, found.remote.description
        )
        found.source.tier.delete(file.key)
    local = localize(found.remote, found.cache)
    again = OpenedWeights(
        found.remote,
        local.source,
        found.cache,
        found.downloaded + local.downloaded,
        (*found.refreshed, *local.refreshed),
    )
    return _read_all(again.source, options, []), again


def _collect(result: LoadedWeights, done: list[tuple[FilePlan, list[torch.Tensor], int]]) -> None:
    """Every file's tensors into ``result``, refusing a name that two files hold."""
    owner: dict[str, str] = {}
    for plan, outputs, read in done:
        for wanted, tensor in zip(plan.wanted, outputs, strict=True):
            name = wanted.entry.name
            if name in owner:
                raise WeightsError(
                    f"tensor {name!r} is in both {owner[name]} and {plan.file.name} "
                    "(a multi-rank checkpoint: choose one rank's file with files=)"
                )
            owner[name] = plan.file.name
            result.tensors[name] = tensor
            result.nbytes += wanted.nbytes
        result.bytes_read += read
        (result.verified_files if plan.verify else result.unverified_files).append(plan.file.name)


@dataclass(frozen=True)
class _Options:
    """How every file of one load is read (the arguments of :func:`load`)."""

    target: torch.device
    verify: bool
    tensor_parallel: TensorParallel | None
    include: Sequence[str] | None
    gds: bool
    parallel_files: int
    slot_bytes: int
    on_file: Callable[[str, int], None] | None


def _read_all(
    source: WeightSource, options: _Options, damaged: list[WeightFile]
) -> list[tuple[FilePlan, list[torch.Tensor], int]]:
    """Every file of ``source``, ``parallel_files`` at once.

    Files failing their checksum are appended to ``damaged`` before the error propagates.
    """
    import torch  # noqa: PLC0415 - `import mouthguard.weights` must not cost torch's import

    def one(file: WeightFile) -> tuple[FilePlan, list[torch.Tensor], int]:
        try:
            done = _read_one(source, file, options)
        except ChecksumMismatchError:
            damaged.append(file)
            raise
        if options.on_file is not None:
            options.on_file(file.name, done[2])
        return done

    workers = options.parallel_files
    # Its own pool, not io.pool.SHARED: each job here waits on its file's reads, which
    # run on SHARED (io.host_ring, io.read_ahead); on SHARED, jobs waiting for reads
    # queued behind themselves would deadlock once every thread held one.
    with ThreadPoolExecutor(workers, thread_name_prefix="mouthguard-weights") as pool:
        done = list(pool.map(one, source.files))
    if options.target.type == "cuda":
        torch.cuda.synchronize(options.target)
    return done


def read_file_to_host(
    source: WeightSource, file: WeightFile, *, verify: bool, include: Sequence[str] | None
) -> tuple[FilePlan, list[torch.Tensor], int]:
    """One file of ``source`` into new host tensors, as :func:`load` reads it.

    Returns its plan, its wanted tensors (in ``plan.wanted`` order) and the bytes
    read. For a streaming reader of a source it cannot map (a remote tier read
    without a cache). Raises as :func:`load` does, naming the file.
    """
    import torch  # noqa: PLC0415 - see _read_all

    options = _Options(torch.device("cpu"), verify, None, include, False, 1, SLOT_BYTES, None)
    return _read_one(source, file, options)


def _read_one(
    source: WeightSource, file: WeightFile, options: _Options
) -> tuple[FilePlan, list[torch.Tensor], int]:
    """One file: plan it, allocate its tensors on the device, read into them.

    An error names the file, and the checkpoint's run and step where it is one.
    """
    with source.naming(file):
        return _read_planned(source, file, options)


def _read_planned(
    source: WeightSource, file: WeightFile, options: _Options
) -> tuple[FilePlan, list[torch.Tensor], int]:
    import torch  # noqa: PLC0415 - see _read_all

    verify = options.verify and file.checksum is not None
    plan = plan_file(
        source.tier, file, verify=verify, parallel=options.tensor_parallel, include=options.include
    )
    outputs = [
        torch.empty(w.shape, dtype=torch_dtype(w.entry.dtype), device=options.target)
        for w in plan.wanted
    ]
    flat = [t.reshape(-1).view(torch.uint8) for t in outputs]
    if options.gds and not verify and isinstance(source.tier, LocalTier):
        ranges = [
            (offset, length, flat[i][dest : dest + length])
            for i, w in enumerate(plan.wanted)
            for offset, length, dest in _with_dest(w.ranges)
        ]
        return plan, outputs, read_ranges_gds(source.tier.path_of(file.key), ranges)
    reads = plan.reads(options.slot_bytes)
    ring = None
    if options.target.type != "cpu" or needs_ring(reads, flat):
        ring = HostRing(options.target, slots=READS_AHEAD + 1, slot_bytes=options.slot_bytes)
    return plan, outputs, read_file(source.tier, plan, reads, flat, ring)


def _device(device: str | torch.device) -> torch.device:
    import torch  # noqa: PLC0415 - see load()

    try:
        target = torch.device(device)
    except RuntimeError as exc:
        raise WeightsError(f"{device!r} is not a device: {exc}") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise WeightsError(f"{device!r} asked for, but this process sees no CUDA device")
    if target.type not in {"cpu", "cuda"}:
        raise WeightsError(f"weights load to cpu or cuda devices, not {target.type!r}")
    return target


def _only(source: WeightSource, names: Sequence[str]) -> WeightSource:
    chosen = tuple(f for f in source.files if f.name in set(names))
    missing = sorted(set(names) - {f.name for f in chosen})
    if missing:
        raise WeightsError(f"{source.description} has no file {missing}")
    return replace(source, files=chosen)


def _gds_choice(asked: bool | None, target: torch.device, source: WeightSource) -> tuple[bool, str]:
    if asked is False:
        return False, "not asked for"
    if target.type != "cuda":
        return False, "the device is not a GPU"
    if not isinstance(source.tier, LocalTier):
        return False, "the source is not a local filesystem"
    usable, reason = gds_status()
    if asked and not usable:
        raise WeightsError(f"GPUDirect Storage asked for but unavailable: {reason}")
    return usable, reason


def _with_dest(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int]]:
    """``(offset, length)`` ranges with each one's offset in the returned tensor."""
    out, dest = [], 0
    for offset, length in ranges:
        out.append((offset, length, dest))
        dest += length
    return out
