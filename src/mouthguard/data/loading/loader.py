"""``StreamingDataLoader``: a DataLoader that knows how far it got, for exact resume with workers.

DataLoader workers each hold a copy of the dataset; the main process never
learns what they yielded, only what it hands to the training loop. So the
position is counted here, at delivery: every batch but a rank's last holds
exactly ``batch_size`` samples (workers take whole batches of the rank's
sequence in turn; :mod:`~mouthguard.data.loading.order`), so after ``j`` batches from
position ``n`` the rank has consumed ``min(n + j * batch_size, epoch length)``
samples, whatever ``collate_fn`` makes of them.

Before each iteration the loader sets the dataset's start position, and the
workers, created by that iteration, begin there. An iteration that runs to the
end of the epoch moves the position to the start of the next one.

With ``persistent_workers=True`` the workers outlive an iteration and keep the
dataset copy of the first one -- with it, its parsed indexes, so an index is
parsed once per worker per job rather than every epoch -- but that copy would
never see a new position. So the loader keeps the start position in shared
memory (two integers: epoch and samples consumed), writes it before every
iteration, and a worker of a dataset so attached reads it when its iteration
starts (:meth:`StreamingDataset.attach_start`); the position a ``state_dict``
records is counted here, at delivery, as without persistent workers. A burst
signal is mirrored for the loader's lifetime instead of per iteration. Workers of a dataset
on S3 cannot be forked from the training process: the S3 client does not survive
``fork`` (:mod:`~mouthguard.data.location`). Unless ``multiprocessing_context``
says otherwise they come from multiprocessing's fork server, a clean process
started once (it never touched S3) with torch and mouthguard's reader already
imported and botocore's S3 models loaded (:mod:`~mouthguard.data.loading.worker_preload`),
so a worker starts in milliseconds every epoch instead of importing torch again
as a spawned one would; each opens its own connection from the dataset's
``s3://`` URL. The fork server is started when the loader is built, and the
build waits until it has imported its preload, so its own start (seconds with a
cold page cache) is part of building the loader, not of the first batch. A burst signal of
the dataset is mirrored into the workers through shared memory
(:class:`~mouthguard.data.burst.SharedBurst`) for the iteration's duration.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any, Literal

from torch.utils.data import DataLoader

from mouthguard.data.burst import SharedBurst
from mouthguard.data.loading.forget_main import MAIN_ENV
from mouthguard.data.loading.stream import StreamingDataset

#: Imported once by the fork server, before it forks any worker.
_PRELOAD = ["__main__", "mouthguard.data.loading.worker_preload", "mouthguard.tiers.s3"]


def main_module_by_name() -> str | None:
    """The main module's name when it was run as ``python -m NAME``; None otherwise.

    A worker started by the fork server runs the parent's main module again as
    ``__mp_main__`` before it unpickles anything. multiprocessing preloads a
    main module run from a path into the fork server (its ``"__main__"``
    preload), so each worker finds its imports done; one run with ``-m`` it
    does not, and every worker of every epoch imported it and all it imports
    afresh (the benchmark's worker started about 0.2-0.4 s later for it,
    measured on 2 loaded CPUs; docs/benchmarks-data.md). Naming the module in
    the preload imports it in the server once, under its own name (so its
    ``if __name__ == "__main__"`` block does not run there), and then forgets
    the module itself (:mod:`~mouthguard.data.loading.forget_main`); each worker
    still runs its top level as before, with the imports found done. A package's
    ``__main__`` is left out: multiprocessing does not run it in workers either,
    and it usually starts the program at import.
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or name == "__main__" or name.endswith(".__main__"):
        return None
    return name


def fork_server() -> multiprocessing.context.BaseContext:
    """The fork-server context of multiprocessing, preloading what a dataset worker imports.

    That is mouthguard's reader (torch with it), the S3 client's models, and
    the main module (see :func:`main_module_by_name`). The preload only applies
    if the fork server has not started yet (it is one per process); one started
    earlier works the same, its workers import more.
    """
    context = multiprocessing.get_context("forkserver")
    preload = list(_PRELOAD)
    main = main_module_by_name()
    if main is not None:
        # The server inherits this environment when it starts: preload_end, imported
        # after the main module, reads the name there.
        os.environ[MAIN_ENV] = main
        preload += [main, "mouthguard.data.loading.preload_end"]
    context.set_forkserver_preload(preload)
    return context


def _ready() -> None:
    """A child that does nothing: forking it proves the fork server has imported its preload."""


def start_fork_server(context: multiprocessing.context.BaseContext) -> None:
    """Start the fork server now, if it is not running, and wait until it has its preload.

    Called when a loader that will use it is built: its start -- importing
    torch and the reader in a fresh process, seconds with a cold page cache
    (7-8 s measured on the 2-core development VM) -- is then part of building
    the loader, not of the first batch. The server forks nothing before its
    preload is imported, so one empty child started and joined is the wait.
    """
    child = context.Process(target=_ready, name="mouthguard-forkserver-ready")  # type: ignore[attr-defined]
    child.start()
    child.join()
    os.environ.pop(MAIN_ENV, None)  # read by the server at its start: not left to other children


class StreamingDataLoader(DataLoader[Any]):
    """A ``DataLoader`` over a :class:`StreamingDataset` with ``state_dict``/``load_state_dict``.

    Args:
        dataset: the dataset; its ``batch_size`` must be the loader's.
        batch_size: default the dataset's; None turns automatic batching off
            (then each item counts as one sample).
        **kwargs: any other ``DataLoader`` argument (``num_workers``,
            ``collate_fn``, ``pin_memory``, ``prefetch_factor``,
            ``persistent_workers``, ...), except ``in_order=False``.

    Raises:
        ValueError: the batch sizes differ, or ``in_order`` is False
            (out-of-order batches break the resume position).
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int | Literal["dataset"] | None = "dataset",
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise TypeError("StreamingDataLoader needs a StreamingDataset")
        size = dataset.batch_size if batch_size == "dataset" else batch_size
        if size is not None and size != dataset.batch_size:
            raise ValueError(
                f"the loader's batch_size ({size}) must be the dataset's ({dataset.batch_size}): "
                "workers take whole batches of the dataset's size in turn"
            )
        if kwargs.get("in_order", True) is False:
            raise ValueError(
                "in_order=False hands batches out as workers finish them, so the position a "
                "state_dict records would not be the samples delivered; leave it on"
            )
        location = dataset.dataset.location
        if kwargs.get("num_workers", 0) > 0 and not location.fork_safe:
            if location.spec is None:
                raise ValueError(
                    "DataLoader workers cannot share an S3 tier object: pass the dataset's "
                    "s3:// URL, so that each worker opens its own connection"
                )
            context = kwargs.setdefault("multiprocessing_context", fork_server())
            if isinstance(context, str):
                context = multiprocessing.get_context(context)
            if context.get_start_method() == "forkserver":
                start_fork_server(context)
        super().__init__(dataset, batch_size=size if isinstance(size, int) else None, **kwargs)
        self._stream = dataset
        self._epoch = dataset.epoch
        self._consumed = dataset.consumed
        # Persistent workers: where they read each iteration's start, and the burst
        # mirror they keep (both made before the workers start, so they inherit them).
        self._start: Any = None
        self._kept_burst: SharedBurst | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._epoch

    @property
    def consumed(self) -> int:
        """Samples of that epoch this rank has delivered."""
        return self._consumed

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next from its start, unless it is the epoch in progress (resume)."""
        self._stream.set_position(self._epoch, self._consumed)
        self._stream.set_epoch(epoch)
        self._epoch, self._consumed = self._stream.epoch, self._stream.consumed

    def state_dict(self) -> dict[str, object]:
        """Epoch, samples delivered on this rank, seed, dataset fingerprint and order settings."""
        self._stream.set_position(self._epoch, self._consumed)
        return self._stream.state_dict()

    def load_state_dict(self, state: object, *, force: bool = False) -> None:
        """Resume at a saved position (see :meth:`StreamingDataset.load_state_dict`).

        Raises:
            DatasetChangedError: the dataset changed (both fingerprints named);
                ``force=True`` resumes anyway.
            DataStateError: malformed, or saved under another order or partition.
        """
        self._stream.load_state_dict(state, force=force)
        self._epoch, self._consumed = self._stream.epoch, self._stream.consumed

    def multiprocessing_context_or_default(self) -> multiprocessing.context.BaseContext:
        """The context the workers are started with (shared memory must suit it)."""
        context = self.multiprocessing_context
        if context is None:
            return multiprocessing.get_context()
        if isinstance(context, str):
            return multiprocessing.get_context(context)
        return context  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator of batches
        stream = self._stream
        stream.set_position(self._epoch, self._consumed)
        total = stream.samples_per_rank()
        step = self.batch_size if self.batch_size is not None else 1
        burst = stream.burst
        persistent = self.persistent_workers and self.num_workers > 0
        shared = SharedBurst(burst) if burst is not None and self.num_workers > 0 else None
        if persistent and shared is not None:  # the workers keep the first one: so do we
            if self._kept_burst is None:
                self._kept_burst = shared
                weakref.finalize(self, shared.stop)
            else:
                shared.stop()
            shared = None
        if persistent and self._start is None:
            self._start = self.multiprocessing_context_or_default().RawArray("q", 2)
        stream.attach_start(self._start if persistent else None)
        if persistent:
            self._start[0], self._start[1] = self._epoch, self._consumed
        if shared is not None or self._kept_burst is not None:
            stream.burst = shared or self._kept_burst  # what the workers copy as they start
        try:
            batches = super().__iter__()
        finally:
            stream.burst = burst
        finished = False
        try:
            for batch in batches:
                self._consumed = min(self._consumed + step, total)
                yield batch
            finished = True
        finally:
            if shared is not None:
                shared.stop()
        if finished:
            self._epoch, self._consumed = self._epoch + 1, 0
            stream.set_position(self._epoch, self._consumed)
