"""Every loader, built the way its documentation shows, yielding the same batches.

The floor (``memory``) yields one payload already in memory for every key:
what the DataLoader, the collate and the transfer to the main process cost
with no I/O at all. Each reader shuffles with its own mechanism and feeds a ``DataLoader`` (its own
subclass where it has one) with ``batch_size`` and ``num_workers``; the same
collate function, run in the workers, turns the samples of a batch into
``(keys, uint8 tensor [batch, sample_size])``, so every reader delivers the same
thing to the training loop, through the same shared-memory transfer.

Sources: ``local`` reads each format's local copy in place; ``s3`` reads the
bucket on the benchmark's server through each library's S3 support, with its own
cache directory (:func:`benchmarks.data.config.cache_dir`) where it has one:

* raw files: one ``GetObject`` per sample (boto3, a client per process); no cache.
* webdataset: it has no S3 client of its own; its ``http`` handler (``curl``)
  reads presigned URLs of the shards, through its ``cache_dir``.
* mosaicml-streaming: ``remote="s3://..."`` (boto3; endpoint from
  ``S3_ENDPOINT_URL``), ``local=`` the cache.
* litdata: ``"s3://..."`` with ``storage_options={"endpoint_url": ...}``; its
  obstore download path refuses a plain-http endpoint (reqwest ``BadScheme``), so
  ``allow_http`` is added to its module-level obstore client options.
* mouthguard: ``s3://`` URL (obstore; settings from ``AWS_*``), ``cache_dir``;
  its S3 workers are spawned (the S3 client does not survive fork). Locally it
  reads in place (no ``cache_dir``, its default), and as ``mouthguard-cache``
  through a ``cache_dir`` (verified once, then trusted by its on-disk stamp).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data import Dataset as MapDataset

from benchmarks.data import config, samples
from benchmarks.data.config import PAYLOAD, Cell
from benchmarks.data.writers import mosaic_workaround, s3_client

Batch = tuple[list[str], torch.Tensor]
SEED = 0


def collate(items: Sequence[Any], key_field: str, size: int) -> Batch:
    """``(keys, payloads as one uint8 tensor)`` from a batch of samples."""
    out = np.empty((len(items), size), dtype=np.uint8)
    keys = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            k, data = item[key_field], item[PAYLOAD]
        else:
            k, data = item
        keys.append(str(k))
        out[i] = np.frombuffer(data, dtype=np.uint8)
    return keys, torch.from_numpy(out)


class InMemory(IterableDataset[tuple[str, bytes]]):
    """The floor: every key, with one payload already in memory; workers split the keys."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        data = samples.payload(0, self.size)
        for i in range(worker, self.count, workers):
            yield samples.key(i), data


class RawFiles(MapDataset[tuple[str, bytes]]):
    """One file per sample, read with ``open``/``read``."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = str(directory)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[str, bytes]:
        k = samples.key(i)
        with open(os.path.join(self.directory, f"{k}.{PAYLOAD}"), "rb") as f:  # noqa: PTH118
            return k, f.read()


class RawObjects(MapDataset[tuple[str, bytes]]):
    """One object per sample, one ``GetObject`` each (a boto3 client per process)."""

    def __init__(self, bucket: str, prefix: str, count: int) -> None:
        self.bucket, self.prefix, self.count = bucket, prefix, count
        self._client: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[str, bytes]:
        if self._pid != os.getpid():  # a worker: its own client, never its parent's
            self._client, self._pid = s3_client(), os.getpid()
        k = samples.key(i)
        got = self._client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{k}.{PAYLOAD}")
        return k, got["Body"].read()


def build(cell: Cell) -> Iterable[Batch]:
    """The loader of ``cell``: iterate it once per epoch."""
    return BUILDERS[cell.reader](cell)


def _kwargs(cell: Cell, key_field: str) -> dict[str, Any]:
    """The DataLoader arguments every reader gets alike (persistent workers included)."""
    return {
        "batch_size": cell.batch_size,
        "num_workers": cell.workers,
        "collate_fn": functools.partial(collate, key_field=key_field, size=cell.sample_size),
        "persistent_workers": cell.persistent and cell.workers > 0,
    }


def _root(cell: Cell) -> Path:
    return Path(cell.root)


def _cache(cell: Cell) -> Path:
    path = config.cache_dir(_root(cell), cell.reader, cell.source)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _memory(cell: Cell) -> Iterable[Batch]:
    return DataLoader(InMemory(cell.samples, cell.sample_size), **_kwargs(cell, ""))


def _raw(cell: Cell) -> Iterable[Batch]:
    dataset: MapDataset[tuple[str, bytes]]
    if cell.source == "local":
        dataset = RawFiles(config.dataset_dir(_root(cell), "raw"), cell.samples)
    else:
        assert cell.site is not None
        dataset = RawObjects(cell.site.bucket, config.s3_prefix("raw"), cell.samples)
    generator = torch.Generator().manual_seed(SEED)
    return DataLoader(dataset, shuffle=True, generator=generator, **_kwargs(cell, ""))


def _webdataset(cell: Cell) -> Iterable[Batch]:
    import webdataset as wds  # type: ignore[import-untyped]  # noqa: PLC0415

    local = config.dataset_dir(_root(cell), "webdataset")
    names = sorted(p.name for p in local.glob("*.tar"))
    cache: str | None = None
    if cell.source == "local":
        urls = [str(local / n) for n in names]
    else:
        assert cell.site is not None
        client = s3_client()
        prefix = config.s3_prefix("webdataset")
        urls = [
            client.generate_presigned_url(
                "get_object",
                Params={"Bucket": cell.site.bucket, "Key": f"{prefix}/{n}"},
                ExpiresIn=24 * 3600,
            )
            for n in names
        ]
        cache = str(_cache(cell))
    dataset = wds.WebDataset(
        urls,
        shardshuffle=len(urls),
        nodesplitter=wds.split_by_node,
        empty_check=False,
        cache_dir=cache,
        seed=SEED,
    ).shuffle(config.WDS_SHUFFLE)
    return DataLoader(dataset, **_kwargs(cell, "__key__"))


def _mosaic(cell: Cell) -> Iterable[Batch]:
    mosaic_workaround()
    from streaming import StreamingDataLoader, StreamingDataset  # noqa: PLC0415
    from streaming.base.util import clean_stale_shared_memory  # noqa: PLC0415

    clean_stale_shared_memory()
    remote: str | None = None
    local = str(config.dataset_dir(_root(cell), "mosaic"))
    if cell.source != "local":
        assert cell.site is not None
        remote = f"s3://{cell.site.bucket}/{config.s3_prefix('mosaic')}"
        local = str(_cache(cell))
    dataset = StreamingDataset(
        remote=remote, local=local, shuffle=True, shuffle_seed=SEED, batch_size=cell.batch_size
    )
    loader: Iterable[Batch] = StreamingDataLoader(dataset, **_kwargs(cell, "key"))
    return loader


def _litdata(cell: Cell) -> Iterable[Batch]:
    import litdata  # type: ignore[import-untyped]  # noqa: PLC0415

    options: dict[str, Any] = {}
    if cell.source == "local":
        dataset = litdata.StreamingDataset(
            str(config.dataset_dir(_root(cell), "litdata")), shuffle=True, seed=SEED
        )
    else:
        assert cell.site is not None
        from litdata.streaming import downloader  # type: ignore[import-untyped]  # noqa: PLC0415

        # Its obstore path would refuse the loopback server's http:// endpoint.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
        options["endpoint_url"] = cell.site.endpoint
        dataset = litdata.StreamingDataset(
            f"s3://{cell.site.bucket}/{config.s3_prefix('litdata')}",
            cache_dir=str(_cache(cell)),
            shuffle=True,
            seed=SEED,
            storage_options=options,
        )
    loader: Iterable[Batch] = litdata.StreamingDataLoader(dataset, **_kwargs(cell, "key"))
    return loader


def _mouthguard(cell: Cell) -> Iterable[Batch]:
    from mouthguard.data import StreamingDataLoader, StreamingDataset  # noqa: PLC0415

    if cell.source == "local":
        dataset = StreamingDataset(
            config.dataset_dir(_root(cell), cell.reader),
            shuffle=True,
            seed=SEED,
            batch_size=cell.batch_size,
            cache_dir=_cache(cell) if cell.reader == "mouthguard-cache" else None,
        )
    else:
        assert cell.site is not None
        dataset = StreamingDataset(
            f"s3://{cell.site.bucket}/{config.s3_prefix('mouthguard')}/bench",
            shuffle=True,
            seed=SEED,
            batch_size=cell.batch_size,
            cache_dir=_cache(cell),
        )
    kwargs = _kwargs(cell, "__key__")
    kwargs.pop("batch_size")
    return StreamingDataLoader(dataset, **kwargs)


BUILDERS = {
    "memory": _memory,
    "raw": _raw,
    "webdataset": _webdataset,
    "mosaic": _mosaic,
    "litdata": _litdata,
    "mouthguard": _mouthguard,
    "mouthguard-cache": _mouthguard,
}
