"""Sizing every object under a prefix on S3: a listing with sizes vs a listing and a HEAD each.

What the KV store does when it opens over a remote (``RemoteLevel.scan``) and what
the weights node cache does before a load: learn each object's size (and ETag).
Two ways, measured in the same run against the same objects on the project's
throwaway Ceph RGW on 127.0.0.1 (:class:`tests.s3.ceph.CephCluster`):

* ``list + head``: ``Tier.list`` then ``Tier.head`` per key (what the KV scan
  did before ``list_info``; one request per object);
* ``list_info``: ``Tier.list_info`` (ListObjectsV2 pages of 1000, sizes and
  ETags included).

Each count of objects is timed ``--repeats`` times per way, the ways alternating;
the median and the min-max are printed as a markdown table, with the requests
each way sends. Uploading the objects is not timed. Loopback has no network
latency: against a remote endpoint the per-object HEADs cost a round trip each,
so the gap only grows.

Run: ``python -m benchmarks.listing [--counts 1000,4000] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from mouthguard.tiers.s3 import S3Tier

OBJECT_BYTES = 1024


def _time(work: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    total = work()
    return time.perf_counter() - started, total


def _measure(tier: S3Tier, prefix: str, count: int, repeats: int) -> dict[str, list[float]]:
    def with_heads() -> int:
        return sum(tier.head(key).size for key in tier.list(prefix))

    def with_listing() -> int:
        return sum(info.size for info in tier.list_info(prefix))

    ways = {"list + head": with_heads, "list_info": with_listing}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, work in ways.items():
            took, total = _time(work)
            if total != count * OBJECT_BYTES:
                raise RuntimeError(f"{name} sized {total} bytes, expected {count * OBJECT_BYTES}")
            seconds[name].append(took)
    return seconds


def _upload(tier: S3Tier, prefix: str, count: int) -> None:
    body = os.urandom(OBJECT_BYTES)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: tier.put(f"{prefix}{i:08x}", body), range(count)))


def main(argv: list[str] | None = None) -> int:
    """Start the RGW, upload, measure, print the table; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,4000", help="objects per prefix, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per way and count")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    from tests.s3.ceph import CephCluster  # noqa: PLC0415 - the test suite's launcher
    from tests.s3.fixtures import S3Server  # noqa: PLC0415

    with CephCluster() as endpoint:
        server = S3Server(endpoint.endpoint, endpoint.access_key, endpoint.secret_key)
        bucket = f"listing-{uuid.uuid4().hex[:12]}"
        server.client().create_bucket(Bucket=bucket)
        tier = S3Tier(f"s3://{bucket}", **server.tier_options())
        load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        print(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load}")
        print(f"python -m benchmarks.listing --counts {args.counts} --repeats {args.repeats}\n")
        print("| objects | way | requests | median s | min-max s | objects/s |")
        print("|---:|---|---|---:|---:|---:|")
        for count in counts:
            prefix = f"n{count}/"
            _upload(tier, prefix, count)
            pages = math.ceil(count / 1000)
            requests = {"list + head": f"{pages} LIST + {count} HEAD", "list_info": f"{pages} LIST"}
            for name, runs in _measure(tier, prefix, count, args.repeats).items():
                median = statistics.median(runs)
                print(
                    f"| {count} | {name} | {requests[name]} | {median:.3f} | "
                    f"{min(runs):.3f}-{max(runs):.3f} | {count / median:,.0f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
