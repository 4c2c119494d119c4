"""``mouthguard.weights.iter_tensors``: model weights handed over one tensor at a time.

A consumer that copies each tensor into its own memory anyway (an inference
engine's ``load_weights``) needs no private copy of the file first. So each file
of a local source (a model directory, a hub snapshot, a checkpoint, the node
cache of an ``s3://`` model) is mapped (``mmap``, copy-on-write) and every tensor
is handed over as a CPU tensor that is a *view* of the mapping: its bytes come
from the page cache as the consumer touches them, and the only memory a load
takes beyond the page cache is the pages a consumer writes to (private to this
process, never written back to the file).

Verification runs beside the consumer: for a file with a checksum (a
checkpoint's xxh3 and sha256), a thread hashes the mapped file from its first
byte to its last while the consumer copies its tensors (the disk read is shared:
whichever touches a page first brings it in). Once a file's last tensor is
handed over, the stream waits for that file's hash and raises
:class:`~mouthguard.errors.ChecksumMismatchError` naming the file before it hands
over anything of the next file, and when the last file is done, before the
iteration ends. A consumer that fed the tensors to a model therefore sees the
error while it is still loading, before it can serve anything from them; one
that stops early calls :meth:`TensorStream.check`.

A source that cannot be mapped (a remote tier read without ``cache_dir``) is
read one file at a time by :func:`~mouthguard.weights.loader.read_file_to_host`
(verified before its tensors are handed over): host memory then holds one file's
tensors at a time.

Not here: tensor-parallel slicing (an engine slices in its own weight loaders)
and device targets (use :func:`~mouthguard.weights.loader.load`).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mouthguard.checkpoint.mapped_load import tensor_view
from mouthguard.errors import ChecksumMismatchError, WeightsError
from mouthguard.format.checksum import StreamHasher
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.weights.loader import OpenedWeights, open_weights, read_file_to_host
from mouthguard.weights.pipeline import check_file
from mouthguard.weights.plan import FilePlan, Wanted, plan_file
from mouthguard.weights.source import WeightFile

if TYPE_CHECKING:
    import torch

#: Bytes the hashing thread feeds the hasher at a time: a view of the mapping, no
#: copy; small enough that the thread gives the interpreter lock back often.
HASH_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass
class StreamStats:
    """What a :class:`TensorStream` handed over so far.

    Attributes:
        nbytes: bytes of the tensors handed over.
        verified_files: files whose every byte matched their checksum.
        unverified_files: files without a checksum (or streamed with ``verify=False``).
        downloaded: bytes pulled from a remote source into the cache when opened.
        refreshed_files: cached files that were stale and fetched again when opened.
        seconds: from the call until the last file was checked.
    """

    nbytes: int = 0
    verified_files: list[str] = field(default_factory=list)
    unverified_files: list[str] = field(default_factory=list)
    downloaded: int = 0
    refreshed_files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def iter_tensors(
    source: str | os.PathLike[str] | Tier,
    *,
    prefix: str = "",
    run: str | None = None,
    step: int | None = None,
    verify: bool = True,
    include: Sequence[str] | None = None,
    files: Sequence[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> TensorStream:
    """Open ``source`` for streaming; iterate the result for ``(name, tensor)`` pairs.

    Arguments are :func:`~mouthguard.weights.loader.load`'s (the same sources and
    layouts). The tensors are CPU tensors backed by a copy-on-write mapping of the
    file (see the module docstring); they stay valid after the stream is done.

    Raises (here, or while iterating):
        WeightsError: nothing loadable at ``source``, or two files hold one name.
        ChecksumMismatchError: a file's bytes do not match its checksum (the
            error names it; a damaged node-cache copy is removed from the cache,
            so the next load downloads it again).
        RankFileError: a malformed header. TierError: the storage failed.
    """
    started = time.perf_counter()
    opened = open_weights(
        source, prefix=prefix, run=run, step=step, files=files, cache_dir=cache_dir
    )
    return TensorStream(opened, verify=verify, include=include, started=started)


class TensorStream:
    """The tensors of one source, each handed over once (see the module docstring).

    Iterate it once. ``stats`` grows as files are done; :meth:`check` verifies
    the files whose tensors were handed over but whose check the iteration did
    not reach.
    """

    def __init__(
        self,
        opened: OpenedWeights,
        *,
        verify: bool,
        include: Sequence[str] | None,
        started: float,
    ) -> None:
        self.source = opened.source.description
        self.kind = opened.source.kind
        self.stats = StreamStats(
            downloaded=opened.downloaded, refreshed_files=list(opened.refreshed)
        )
        self._opened = opened
        self._verify = verify
        self._include = include
        self._started = started
        self._iterated = False
        self._owner: dict[str, str] = {}
        self._hashing: dict[str, tuple[FilePlan, _Hashing]] = {}  # started, not checked

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._iterated:
            raise WeightsError(f"{self.source}: a tensor stream is iterated once")
        self._iterated = True
        return self._tensors()

    def check(self) -> None:
        """Wait for and check every file hashed but not yet checked; raise on a mismatch."""
        for name in list(self._hashing):
            self._finish(name)

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        source = self._opened.source
        for file in source.files:
            verify = self._verify and file.checksum is not None
            if isinstance(source.tier, LocalTier):
                yield from self._mapped(source.tier, file, verify)
            else:
                with source.naming(file):
                    plan, tensors, _ = read_file_to_host(
                        source, file, verify=verify, include=self._include
                    )
                self._done(plan)
                for wanted, tensor in zip(plan.wanted, tensors, strict=True):
                    yield self._handed(plan, wanted), tensor
        self.stats.seconds = time.perf_counter() - self._started

    def _mapped(
        self, tier: LocalTier, file: WeightFile, verify: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        source = self._opened.source
        with source.naming(file):
            plan = plan_file(tier, file, verify=verify, parallel=None, include=self._include)
            mapped = _map(tier, file.key, plan.size)
            # Tensor views are made before any is handed over: a bad dtype fails here.
            views = [_view(mapped, wanted) for wanted in plan.wanted]
        if verify:
            self._hashing[file.name] = (plan, _Hashing(mapped, plan.size, plan))
        for wanted, view in zip(plan.wanted, views, strict=True):
            yield self._handed(plan, wanted), view
        if verify:
            self._finish(file.name)
        else:
            self._done(plan)

    def _handed(self, plan: FilePlan, wanted: Wanted) -> str:
        name = wanted.entry.name
        if name in self._owner:
            raise WeightsError(
                f"tensor {name!r} is in both {self._owner[name]} and {plan.file.name} "
                "(a multi-rank checkpoint: choose one rank's file with files=)"
            )
        self._owner[name] = plan.file.name
        self.stats.nbytes += wanted.nbytes
        return name

    def _finish(self, name: str) -> None:
        plan, hashing = self._hashing.pop(name)
        source = self._opened.source
        try:
            with source.naming(plan.file):
                check_file(plan, hashing.result())
        except ChecksumMismatchError as exc:
            if self._opened.cache is None:
                raise
            # The node-local copy rotted since it was cached (the remote one was
            # verified when downloaded). Its tensors are out already, so this load
            # fails; dropping the copy makes the next one download it again.
            source.tier.delete(plan.file.key)
            raise ChecksumMismatchError(
                f"{exc}; the damaged cached copy is removed, the next load downloads it again"
            ) from exc
        self._done(plan)

    def _done(self, plan: FilePlan) -> None:
        done = self.stats.verified_files if plan.verify else self.stats.unverified_files
        done.append(plan.file.name)


class _Hashing:
    """A thread hashing a mapped file from its first byte to its last."""

    def __init__(self, mapped: mmap.mmap, size: int, plan: FilePlan) -> None:
        self._hasher = StreamHasher(with_sha256=plan.file.sha256 is not None)
        self._error: BaseException | None = None
        # Its own thread, not io.pool.SHARED: it hashes one file from end to end while
        # the engine takes the views, and would hold a shared thread all that time.
        self._thread = threading.Thread(
            target=self._run, args=(mapped, size), name="mouthguard-weights-hash", daemon=True
        )
        self._thread.start()

    def _run(self, mapped: mmap.mmap, size: int) -> None:
        try:
            with memoryview(mapped) as whole:
                for start in range(0, size, HASH_CHUNK_BYTES):
                    with whole[start : start + HASH_CHUNK_BYTES] as chunk:
                        self._hasher.update(chunk)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer's thread
            self._error = exc

    def result(self) -> StreamHasher:
        """The hasher, fed the whole file (waits for the thread; re-raises its error)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._hasher


def _map(tier: LocalTier, key: str, size: int) -> mmap.mmap:
    """``key`` mapped copy-on-write, opened with the tier's own checks.

    Copy-on-write, not read-only: a consumer may write to a tensor (the write
    stays in this process) where a read-only mapping would crash it.
    """
    fd, actual = tier.open_object(key)
    try:
        if actual != size:
            raise WeightsError(f"{key} changed size while being opened ({size} -> {actual})")
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    # Ask the kernel to read the whole file ahead, in the background: a cold start
    # then reads the disk while the consumer copies the pages already in.
    if hasattr(mmap, "MADV_WILLNEED"):
        mapped.madvise(mmap.MADV_WILLNEED)
    return mapped


def _view(mapped: mmap.mmap, wanted: Wanted) -> torch.Tensor:
    """The tensor ``wanted`` as a view of the mapping (a copy only if misaligned)."""
    entry = wanted.entry
    return tensor_view(mapped, entry.offset, entry.length, entry.dtype, tuple(entry.shape))
