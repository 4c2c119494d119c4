"""Datasets: verified WebDataset shards, a bounded shared cache, and an exactly resumable loader.

::

    from mouthguard.data import StreamingDataLoader, StreamingDataset, index_dataset, pack

    pack("photos/", "datasets/", "photos")                 # x.jpg + x.json -> one sample
    ds = StreamingDataset("datasets/photos", shuffle=True, seed=0, batch_size=32,
                          cache_dir="/mnt/nvme/cache", cache_limit=100 << 30)
    loader = StreamingDataLoader(ds, batch_size=32, num_workers=4)
    state = loader.state_dict()                            # epoch, position, seed, fingerprint

    index_dataset("s3://bucket/c4")                        # the user's *.tar or *.parquet, in place
    rows = StreamingDataset("s3://bucket/c4", shuffle=True, cache_dir="/mnt/nvme/cache")

Module map, one subpackage per job (each ``__init__`` maps its own modules):
:mod:`~mouthguard.data.formats` (the layout, key rules, tar bytes, index, manifest and
records, each with its hostile-input parser), :mod:`~mouthguard.data.writing` (writing
and packing shards), :mod:`~mouthguard.data.indexing` (indexing a user's tars or
Parquet files in place), :mod:`~mouthguard.data.fetching` (the local shard cache,
downloads of shards and byte ranges, a shard handed out range by range as each range
verifies, prefetch), :mod:`~mouthguard.data.reading` (samples out of shards, rows out
of row groups) and :mod:`~mouthguard.data.loading` (epoch order and partitioning, the
saved position, the torch side). Beside them: :mod:`~mouthguard.data.location` (where
a dataset lives), :mod:`~mouthguard.data.dataset` (a committed dataset, opened),
:mod:`~mouthguard.data.verify` (re-reading every byte of one) and
:mod:`~mouthguard.data.burst` (yielding to checkpoint bursts).

The torch side is imported on first use, so the command line and the writer
start without torch; pyarrow only when a Parquet dataset is indexed or read
(:mod:`~mouthguard.data.formats.arrow`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mouthguard.data.burst import BurstSignal
from mouthguard.data.dataset import Dataset, open_dataset
from mouthguard.data.formats.manifest import DatasetManifest, ShardRecord
from mouthguard.data.indexing.adopt import index_dataset
from mouthguard.data.verify import ShardCheck, VerifyReport, verify_dataset
from mouthguard.data.writing.pack import pack
from mouthguard.data.writing.writer import ShardWriter, discard_incomplete

if TYPE_CHECKING:
    from mouthguard.data.loading.loader import StreamingDataLoader
    from mouthguard.data.loading.stream import StreamingDataset

_LAZY = {
    "StreamingDataLoader": "mouthguard.data.loading.loader",
    "StreamingDataset": "mouthguard.data.loading.stream",
}

__all__ = [
    "BurstSignal",
    "Dataset",
    "DatasetManifest",
    "ShardCheck",
    "ShardRecord",
    "ShardWriter",
    "StreamingDataLoader",
    "StreamingDataset",
    "VerifyReport",
    "discard_incomplete",
    "index_dataset",
    "open_dataset",
    "pack",
    "verify_dataset",
]


def __getattr__(name: str) -> Any:
    """Import the torch-side classes on first use (see the module docstring)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib  # noqa: PLC0415 - only on first use of a lazy name

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
