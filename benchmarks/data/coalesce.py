"""``python -m benchmarks.data.coalesce``: ranges per GET x GETs in flight, one process.

What ``range_coalesce`` and ``range_parallel`` of ``StreamingDataset`` were
chosen from: a mouthguard dataset of 100 KB samples packed into the benchmark's
throwaway Ceph RGW (:mod:`benchmarks.data.s3`; 2 MiB range tables), read through
the loopback proxy that holds every request back ``--delay-ms`` (default 20;
:mod:`benchmarks.data.latency`), one cold shuffled epoch per setting in this
process (``--workers 0``) or through ``StreamingDataLoader`` with DataLoader
workers (built before the clock starts, as in the benchmark's cells), into an
emptied ``cache_dir``, every range verified. Settings run interleaved,
``--repeats`` rounds. Prints one line per run: the setting, seconds to the
first batch of 32 samples, samples/s over the epoch, and GET requests the
server logged during it (its access log).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.data import config, samples, writers
from benchmarks.data.s3 import Server, delayed, log_size, requests_since
from mouthguard.data import StreamingDataLoader, StreamingDataset, pack

BATCH = 32


def epoch(
    url: str, cache: Path, parallel: int, coalesce: int, buffer: int, workers: int, node: int
) -> tuple[float, float]:
    """Seconds to the first batch and to the end of one cold shuffled epoch."""
    shutil.rmtree(cache, ignore_errors=True)
    dataset = StreamingDataset(
        url,
        shuffle=True,
        batch_size=BATCH,
        cache_dir=cache,
        range_parallel=parallel,
        range_coalesce=coalesce,
        shuffle_buffer=buffer,
        node_requests=node or None,
    )
    if workers:
        loader = StreamingDataLoader(dataset, num_workers=workers, collate_fn=len)
        began = time.perf_counter()
        first = 0.0
        for n, _ in enumerate(loader, start=1):
            if n == 1:
                first = time.perf_counter() - began
        return first, time.perf_counter() - began
    began = time.perf_counter()
    first = 0.0
    for n, _ in enumerate(dataset, start=1):
        if n == BATCH:
            first = time.perf_counter() - began
    return first, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--shard-mib", type=int, default=16)
    parser.add_argument("--sample-kb", type=int, default=100)
    parser.add_argument("--coalesce", default="1,2,4")
    parser.add_argument("--parallel", default="4,8")
    parser.add_argument("--buffer", default="4096", help="shuffle_buffer values (0: uniform)")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: none)")
    parser.add_argument("--node", default="0", help="node_requests values (0: no node bound)")
    args = parser.parse_args()
    size = args.sample_kb * 1024
    count = samples.sample_count(args.size_mib * 1024 * 1024, size)
    root = Path(tempfile.mkdtemp(prefix="mouthguard-coalesce-"))
    try:
        raw = config.dataset_dir(root, "raw")
        raw.parent.mkdir(parents=True)
        writers.write("raw", root, count, size, 0)
        with Server() as server:
            assert server.site is not None
            os.environ.update(server.env)
            prefix = f"s3://{server.site.bucket}/coalesce"
            pack(raw, prefix, "bench", shard_size=args.shard_mib * 1024 * 1024)
            with delayed(server, args.delay_ms / 1000) as route:
                os.environ.update(route.env)
                print(
                    f"{count} samples of {size} B in {args.shard_mib} MiB shards, "
                    f"{args.delay_ms:g} ms per request, {args.workers} workers, "
                    f"{os.cpu_count()} CPUs, "
                    f"load {os.getloadavg()[0]:.1f}"
                )
                print("buffer coalesce parallel node first_batch_s samples/s GETs load")
                settings = list(
                    itertools.product(
                        [int(b) for b in args.buffer.split(",")],
                        [int(c) for c in args.coalesce.split(",")],
                        [int(p) for p in args.parallel.split(",")],
                        [int(n) for n in args.node.split(",")],
                    )
                )
                for _ in range(args.repeats):
                    for buffer, coalesce, parallel, node in settings:
                        offset = log_size(Path(server.site.log))
                        first, total = epoch(
                            f"{prefix}/bench",
                            root / "cache",
                            parallel,
                            coalesce,
                            buffer,
                            args.workers,
                            node,
                        )
                        gets = requests_since(Path(server.site.log), offset)["GET"]
                        print(
                            f"{buffer:6d} {coalesce:8d} {parallel:8d} {node:4d} {first:13.3f} "
                            f"{count / total:9.0f} {gets:4d} {os.getloadavg()[0]:4.1f}",
                            flush=True,
                        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
