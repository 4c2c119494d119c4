"""LMCache's local-disk backend replaying the same trace (run with LMCache's interpreter).

LMCache cannot share the project's environment (it pins ``numpy<=2.2.6`` and pulls
CUDA packages), so the benchmark runs this file with another interpreter::

    python -m benchmarks.kvcache --lmcache-python /path/to/lmcache-venv/bin/python

It imports only the standard library, torch and lmcache, reads the trace file the
benchmark wrote, and prints one JSON line. The replay matches the KVStore one: a
request reads its longest stored prefix (``contains`` then ``get_blocking`` per
block), then stores the blocks it lacked and waits until they are on disk.
``LocalDiskBackend`` writes one file per block (``<key>.pt``) and keeps its index
in memory only. Mooncake's ``hash_ids`` are already chained, so each id is the
block's ``chunk_hash``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

CHUNK = 256


def percentile_ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1e3) if values else None


def _open_backends(
    args: argparse.Namespace,
) -> tuple[LocalCPUBackend, LocalDiskBackend, torch.Size]:
    """LMCache's local disk backend (with the CPU pool that stages its I/O) and a block's shape."""
    elements = args.block_kib * 1024 // 2  # fp16
    shape = torch.Size((1, 2, CHUNK, 1, elements // (2 * CHUNK)))
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=False,  # no CPU cache tier: its pool only stages disk I/O
        max_local_cpu_size=0.25,
        local_disk=str(args.dir) + os.sep,
        max_local_disk_size=args.disk_mib / 1024,
    )
    metadata = LMCacheMetadata(
        model_name="bench",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float16,
        kv_shape=tuple(shape),
    )
    cpu = LocalCPUBackend(config, metadata, dst_device="cpu")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    disk = LocalDiskBackend(config, loop, cpu, "cpu", None, metadata)
    return cpu, disk, shape


def _replay(
    trace: Path, cpu: LocalCPUBackend, disk: LocalDiskBackend, shape: torch.Size
) -> dict[str, object]:
    """Replay ``trace``: read each request's cached prefix, put the rest; hit rate and timings."""
    payload = torch.randint(-100, 100, tuple(shape), dtype=torch.int16).view(torch.float16)
    latencies: list[float] = []
    read_bytes = hits = total = 0
    started = time.perf_counter()
    for line in trace.read_text().splitlines():
        ids = json.loads(line)["hash_ids"]
        keys = [CacheEngineKey("bench", 1, 0, int(h), torch.float16) for h in ids]
        covered = 0
        while covered < len(keys) and disk.contains(keys[covered]):
            covered += 1
        got_blocks = 0
        for key in keys[:covered]:
            t0 = time.perf_counter()
            obj = disk.get_blocking(key)
            if obj is None:
                break
            latencies.append(time.perf_counter() - t0)
            read_bytes += obj.get_physical_size()
            obj.ref_count_down()
            got_blocks += 1
        hits += got_blocks
        total += len(keys)
        for key in keys[got_blocks:]:
            obj = cpu.allocate(shape, torch.float16, MemoryFormat.KV_2LTD)
            if obj is None:
                break
            obj.tensor.copy_(payload)
            disk.submit_put_task(key, obj)
            obj.ref_count_down()
        deadline = time.monotonic() + 30
        while any(disk.exists_in_put_tasks(k) for k in keys) and time.monotonic() < deadline:
            time.sleep(0.0005)
    elapsed = time.perf_counter() - started
    return {
        "hit_rate": hits / total if total else 0.0,
        "seconds": elapsed,
        "p50_ms": percentile_ms(latencies, 50),
        "p99_ms": percentile_ms(latencies, 99),
        "gbps": read_bytes / sum(latencies) / 1e9 if latencies else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--block-kib", type=int, required=True)
    parser.add_argument("--disk-mib", type=int, required=True)
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    cpu, disk, shape = _open_backends(args)
    result = _replay(args.trace, cpu, disk, shape)
    files = sum(1 for _ in args.dir.rglob("*.pt"))
    size = sum(p.stat().st_size for p in args.dir.rglob("*.pt"))
    print(
        json.dumps(
            {
                **result,
                "files": files,
                "disk_bytes": size,
                "version": importlib.metadata.version("lmcache"),
            }
        )
    )
    os._exit(0)  # its executor threads and event loop do not shut down cleanly


if __name__ == "__main__":
    main()
