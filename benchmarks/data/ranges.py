"""``python -m benchmarks.data.ranges``: range size x reads in flight, one shard from S3.

What the defaults of streamed shards (:mod:`mouthguard.data.fetching.streamed`) were
chosen from: a 64 MiB object on the throwaway Ceph RGW
(:mod:`benchmarks.data.s3`), read whole as ranged GETs of each size with each
number in flight, every range hashed (sha256) as the streamed reader does, in
one process. Also with a fixed delay added before every GET (``--delay-ms``,
default 20), as a distant bucket adds. Prints one line per setting: seconds
for the object (median of ``--repeats``), MB/s, and seconds to the first
range verified.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.data.s3 import Server
from mouthguard.tiers import Tier
from mouthguard.tiers.faults import FaultPlan, FaultyTier
from mouthguard.tiers.s3 import S3Tier

MiB = 1024 * 1024


def read_all(
    tier: Tier, key: str, size: int, range_size: int, parallel: int
) -> tuple[float, float]:
    """Seconds to read and hash every range, and to the first one."""
    starts = list(range(0, size, range_size))

    def one(start: int) -> float:
        data = tier.get(key, start, min(size, start + range_size))
        hashlib.sha256(data).hexdigest()
        return time.perf_counter()

    began = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(one, starts))
    return time.perf_counter() - began, min(done) - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--ranges-mib", default="1,2,4,8")
    parser.add_argument("--parallel", default="1,2,4,8")
    parser.add_argument("--delay-ms", default="0,20")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mib * MiB
    with Server() as server:
        assert server.site is not None
        os.environ.update(server.env)
        base = S3Tier(
            f"s3://{server.site.bucket}/ranges",
            endpoint=server.site.endpoint,
            region=server.env["AWS_REGION"],
            access_key_id=server.env["AWS_ACCESS_KEY_ID"],
            secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"],
        )
        base.put("object", os.urandom(size))
        print(f"{args.size_mib} MiB object, ceph RGW on loopback, {os.cpu_count()} CPUs")
        print("delay_ms range_MiB parallel seconds MB/s first_range_s")
        for delay in (float(d) for d in args.delay_ms.split(",")):
            plan = FaultPlan(delay=1.0 if delay else 0.0, delay_seconds=delay / 1000)
            tier = FaultyTier(base, plan, seed=0)
            for mib in (int(r) for r in args.ranges_mib.split(",")):
                for parallel in (int(p) for p in args.parallel.split(",")):
                    runs = [
                        read_all(tier, "object", size, mib * MiB, parallel)
                        for _ in range(args.repeats)
                    ]
                    seconds = statistics.median(r[0] for r in runs)
                    first = statistics.median(r[1] for r in runs)
                    print(
                        f"{delay:8.0f} {mib:9d} {parallel:8d} {seconds:7.3f} "
                        f"{size / seconds / 1e6:6.0f} {first:13.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
