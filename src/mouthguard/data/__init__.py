"""Datasets: WebDataset tar shards with a verified manifest, written and checked.

::

    from mouthguard.data import ShardWriter, pack, verify_dataset

    pack("photos/", "datasets/", "photos")       # x.jpg + x.json -> one sample
    report = verify_dataset("datasets/photos")   # every shard and index re-read

Module map: :mod:`~mouthguard.data.names` (layout, key rules),
:mod:`~mouthguard.data.tarfmt` (deterministic tar bytes),
:mod:`~mouthguard.data.index` and :mod:`~mouthguard.data.manifest` (formats and
their hostile-input parsers), :mod:`~mouthguard.data.writer` and
:mod:`~mouthguard.data.pack` (writing), :mod:`~mouthguard.data.dataset` and
:mod:`~mouthguard.data.verify` (reading and checking).
"""

from __future__ import annotations

from mouthguard.data.dataset import Dataset, open_dataset
from mouthguard.data.manifest import DatasetManifest, ShardRecord
from mouthguard.data.pack import pack
from mouthguard.data.verify import ShardCheck, VerifyReport, verify_dataset
from mouthguard.data.writer import ShardWriter, discard_incomplete

__all__ = [
    "Dataset",
    "DatasetManifest",
    "ShardCheck",
    "ShardRecord",
    "ShardWriter",
    "VerifyReport",
    "discard_incomplete",
    "open_dataset",
    "pack",
    "verify_dataset",
]
