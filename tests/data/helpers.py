"""Helpers shared by the dataset tests: small datasets with known samples, and damage."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mouthguard.data import DatasetManifest, ShardWriter
from mouthguard.data.formats.manifest import ShardRecord, encode_manifest, parse_manifest
from mouthguard.data.formats.tarfmt import RECORD
from mouthguard.data.location import Target

#: Shards of about 4 records (40 KiB): a few dozen samples make several shards.
SMALL_SHARD = 4 * RECORD


def sample(i: int) -> dict[str, Any]:
    """Sample ``i``: a text member and a binary one of varying size (some empty)."""
    return {
        "__key__": f"s{i:05d}",
        "txt": f"sample {i}",
        "bin": bytes([i % 256]) * ((i * 397) % 3000),
    }


def write_dataset(
    dest: Target,
    name: str = "ds",
    n: int = 40,
    *,
    shard_size: int = SMALL_SHARD,
    samples: Iterable[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> DatasetManifest:
    """Write ``n`` samples (or ``samples``) as dataset ``name`` in ``dest``; return the manifest."""
    with ShardWriter(dest, name, shard_size=shard_size, **kwargs) as writer:
        for item in samples if samples is not None else (sample(i) for i in range(n)):
            writer.write(item)
    assert writer.manifest is not None
    return writer.manifest


def expected(n: int = 40) -> dict[str, dict[str, bytes]]:
    """Key -> members as bytes, for the samples ``write_dataset`` writes by default."""
    return {
        s["__key__"]: {"txt": s["txt"].encode(), "bin": s["bin"]}
        for s in (sample(i) for i in range(n))
    }


def flip_byte(path: Path, offset: int) -> None:
    """Flip one bit of the byte at ``offset`` (negative: from the end), keeping the size."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes."""
    os.truncate(path, size)


def shard_path(dataset_dir: Path, number: int) -> Path:
    """The file of shard ``number`` of a local dataset."""
    return dataset_dir / "shards" / f"shard-{number:06d}.tar"


def index_path(dataset_dir: Path, number: int) -> Path:
    """The index file of shard ``number`` of a local dataset."""
    return dataset_dir / "shards" / f"shard-{number:06d}.index.json"


def dir_bytes(path: Path) -> int:
    """Bytes of every regular file under ``path`` (files removed meanwhile count as 0)."""
    total = 0
    for entry in path.rglob("*"):
        try:  # measured while other processes evict and rename: a file may vanish
            if entry.is_file():
                total += entry.stat().st_size
        except FileNotFoundError:
            continue
    return total


def rewrite_manifest(dataset_dir: Path, change: Callable[[ShardRecord], ShardRecord]) -> None:
    """Re-encode a local dataset's (unsigned) manifest with ``change`` applied to each shard."""
    path = dataset_dir / "dataset.json"
    manifest = parse_manifest(path.read_bytes(), None)
    shards = [change(s) for s in manifest.shards]
    path.write_bytes(
        encode_manifest(
            manifest.name,
            shards,
            manifest.extensions,
            created=manifest.created,
            keys=None,
            layout=manifest.layout,
        )
    )


def as_packed_before_ranges(dataset_dir: Path) -> None:
    """Make a dataset's manifest what a writer without range tables wrote: version 1."""
    rewrite_manifest(dataset_dir, lambda s: replace(s, ranges=None))
