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

Module map: :mod:`~mouthguard.data.names` (layout, key rules),
:mod:`~mouthguard.data.tarfmt` (deterministic tar bytes),
:mod:`~mouthguard.data.index`, :mod:`~mouthguard.data.manifest` and
:mod:`~mouthguard.data.records` (formats and their hostile-input parsers),
:mod:`~mouthguard.data.writer` and :mod:`~mouthguard.data.pack` (writing),
:mod:`~mouthguard.data.adopt` (indexing a user's dataset in place:
:mod:`~mouthguard.data.tarscan` for tars, :mod:`~mouthguard.data.pqindex` and
:mod:`~mouthguard.data.pqfooter` for Parquet), :mod:`~mouthguard.data.dataset`
and :mod:`~mouthguard.data.verify` (reading and checking),
:mod:`~mouthguard.data.order` (epoch order and partitioning),
:mod:`~mouthguard.data.cache`, :mod:`~mouthguard.data.fetch` and
:mod:`~mouthguard.data.prefetch` (the local cache, downloads of shards and byte
ranges, prefetch), :mod:`~mouthguard.data.streamed`,
:mod:`~mouthguard.data.rangefetch` and :mod:`~mouthguard.data.follow` (a shard
handed out range by range as each range verifies, the process's bounded range
reads, other workers reading a shard being streamed), :mod:`~mouthguard.data.tarread` and
:mod:`~mouthguard.data.pqread` (samples out of shards, rows out of row groups),
:mod:`~mouthguard.data.stream` and :mod:`~mouthguard.data.loader` (the torch side).

The torch side is imported on first use, so the command line and the writer
start without torch; pyarrow only when a Parquet dataset is indexed or read
(:mod:`~mouthguard.data.arrow`).
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
