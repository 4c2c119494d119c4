"""The S3 tier as the KV store's third level, against the real Ceph RGW of the suite."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mouthguard.kvcache import KVStore
from tests.kvcache.helpers import BT, blocks_for, tiers_of, tokens
from tests.s3.fixtures import S3Bucket

BLOCK = 4096


def test_longest_prefix_and_get_across_memory_disk_and_s3(
    tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    toks = tokens(1, 12)
    blocks = blocks_for(toks)
    options = {
        "disk_dir": tmp_path / "kv",
        "memory_bytes": 2 * BLOCK,
        "disk_bytes": 4 * BLOCK,
        "block_tokens": BT,
        "namespace": "s3-model",
        "segment_bytes": BLOCK,
    }
    with KVStore(remote=s3_bucket.tier(), **options) as kv:  # type: ignore[arg-type]
        kv.put(toks, blocks)
        placed = [t[0] for t in tiers_of(kv, toks)]
        assert placed.count("remote") >= 6
        assert {"memory", "disk"} <= set(placed)
        assert kv.longest_prefix(toks) == 12 * BT
        got = kv.get(toks, promote=False)
        assert all(np.array_equal(a, b) for a, b in zip(got, blocks, strict=True))
        assert kv.stats()["remote"]["hits"] == placed.count("remote")
    # A new store (a new process would do the same) lists the bucket and finds them.
    with KVStore(remote=s3_bucket.tier(), **options) as kv:  # type: ignore[arg-type]
        assert kv.longest_prefix(toks) == 12 * BT
        got = kv.get(toks)
        assert all(np.array_equal(a, b) for a, b in zip(got, blocks, strict=True))
