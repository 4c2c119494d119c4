"""Object-store faults end to end: a local fast tier, an S3 durable tier behind a fault proxy.

The proxy (:mod:`tests.s3.fault_proxy`) sits between the S3 tier and the
session's real S3 server and injects 500s, 503 SlowDown, timeouts, connection
resets and truncated bodies, or refuses connections altogether (``down``).
What must hold: saves to the fast tier never depend on the object store;
replication gets every checkpoint across, byte-exact, with retries; nothing
acknowledged is lost; a truncated body is never taken for data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.store import Store
from mouthguard.errors import ObjectExistsError, TierError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.jobs.replicator import ReplicationReport, Replicator
from mouthguard.tiers.base import OPERATIONS, PutMode, Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.s3 import S3Tier
from mouthguard.tiers.wrapper import WrappedTier
from tests.checkpoint.helpers import assert_same
from tests.s3.fault_proxy import FaultProxy, FaultRates
from tests.s3.fixtures import S3Bucket

RUN = "r"
#: Client-side timeouts through the proxy; a ``timeout`` fault holds a request longer.
REQUEST_TIMEOUT = 1.0
TIMEOUT_DELAY = 1.5
#: Bounded catch-up: replication passes before a test gives up.
MAX_PASSES = 8


def fault_tier_options() -> dict[str, object]:
    """The tier's default retry count, with short waits so the tests stay fast."""
    return {
        "backoff_initial": 0.01,
        "backoff_max": 0.1,
        "connect_timeout": REQUEST_TIMEOUT,
        "request_timeout": REQUEST_TIMEOUT,
        "retry_timeout": 10.0,
    }


def s3_tier_via(bucket: S3Bucket, endpoint: str | None, **overrides: object) -> S3Tier:
    """An S3 tier named ``s3`` over ``bucket``'s ``store/`` prefix, reached at ``endpoint``."""
    options = {
        **bucket.server.tier_options(),
        **fault_tier_options(),
        "endpoint": endpoint,
        **overrides,
    }
    return S3Tier(f"{bucket.url}store", name="s3", domain="region-a", **options)  # type: ignore[arg-type]


def two_tier_store(root: Path, s3: Tier) -> Store:
    return Store([LocalTier(root / "fast", name="fast", domain="node-a"), s3])


#: The operations of a tier that may reach its storage (all of them but ``location``).
_IO_OPERATIONS = frozenset(OPERATIONS)


class Watched(WrappedTier):
    """Forwards everything to ``inner`` and records each operation asked of it, in ``asked``."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.asked: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in _IO_OPERATIONS:
            object.__getattribute__(self, "asked").append(name)
        return object.__getattribute__(self, name)


@pytest.fixture
def proxy(s3_bucket: S3Bucket) -> Iterator[FaultProxy]:
    if s3_bucket.server.endpoint is None or not s3_bucket.server.endpoint.startswith("http://"):
        pytest.skip("the fault proxy speaks plain HTTP to a local S3 server only")
    with FaultProxy(s3_bucket.server.endpoint, seed=7, timeout_delay=TIMEOUT_DELAY) as running:
        yield running


def state_of(seed: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 1024, generator=generator), "b": torch.arange(5.0), "step": seed}


def file_keys(tier: Tier, step: int) -> list[str]:
    prefix = CopyRef(tier, RUN, step).prefix
    manifest = read_manifest(tier, RUN, step)
    return [prefix + name for name in [*(f.name for f in manifest.files), MANIFEST_NAME]]


def assert_replicated_exactly(fast: Tier, clean: S3Tier, steps: list[int]) -> None:
    """Every file of every step is on S3 (read without the proxy), byte-identical to fast."""
    for step in steps:
        for key in file_keys(fast, step):
            assert clean.get(key) == fast.get(key), key


def replicate_until_done(store: Store, steps: list[int]) -> list[ReplicationReport]:
    """Replication passes until every step is protected (at most MAX_PASSES)."""
    reports: list[ReplicationReport] = []
    for _ in range(MAX_PASSES):
        report = Replicator(store, store.policy).run_once()
        reports.append(report)
        if report.protected == len(steps) and not report.shortfalls:
            break
    return reports


# --- (a) faults at a rate ---------------------------------------------------------------


def test_saves_and_replication_complete_through_faults(
    tmp_path: Path, s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    store = two_tier_store(tmp_path, s3_tier_via(s3_bucket, proxy.endpoint))
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    proxy.set_rates(FaultRates.uniform(0.08))
    steps = list(range(1, 7))
    for step in steps:
        ckpt.save(step, state_of(step), importance="routine")  # fast tier: never waits on S3
    reports = replicate_until_done(store, steps)
    assert reports[-1].protected == len(steps), [r.shortfalls for r in reports]
    assert not reports[-1].shortfalls
    assert proxy.total_injected > 0, "no fault was injected: the test proves nothing"
    proxy.set_rates(FaultRates())
    clean = s3_tier_via(s3_bucket, s3_bucket.server.endpoint)
    assert_replicated_exactly(store.fast, clean, steps)
    # Loads from S3 alone (through the faults again), every byte verified.
    s3_only = Store([s3_tier_via(s3_bucket, proxy.endpoint)])
    reader = mouthguard.Checkpointer(s3_only, run=RUN, background=False)
    proxy.set_rates(FaultRates.uniform(0.08))
    for step in steps:
        loaded = reader.load(step)
        assert loaded.rejected == []
        assert_same(loaded.state, state_of(step))


def test_truncated_reads_are_retried_or_refused_never_short(
    s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    tier = s3_tier_via(s3_bucket, proxy.endpoint)
    data = bytes(range(256)) * 8192  # 2 MiB
    tier.put("obj", data)
    get = lambda method, _target: method == "GET"  # noqa: E731
    proxy.inject_next("truncate", match=get)
    assert tier.get("obj") == data  # retried transparently
    proxy.inject_next("truncate", match=get)
    buffer = bytearray(len(data))
    tier.read_into("obj", 0, memoryview(buffer))
    assert buffer == data
    # Without retries, a short body is an error, never short data.
    no_retry = s3_tier_via(s3_bucket, proxy.endpoint, max_retries=0)
    proxy.inject_next("truncate", match=get)
    with pytest.raises(TierError):
        no_retry.get("obj")
    proxy.inject_next("truncate", match=get)
    with pytest.raises(TierError):
        no_retry.read_into("obj", 0, memoryview(bytearray(len(data))))
    assert proxy.counts["truncate"] == 4


def on(method: str) -> object:
    """A proxy match for ``method`` (obstore deletes one key with a bulk ``POST ?delete``)."""
    return lambda m, t: m == method or (method == "DELETE" and m == "POST" and "delete" in t)


@pytest.mark.parametrize(
    ("kind", "phase"),
    [("error_500", "before"), ("slow_down", "before"), ("reset", "before"), ("reset", "after")],
)
def test_retryable_faults_on_plain_requests_are_absorbed(
    s3_bucket: S3Bucket, proxy: FaultProxy, kind: str, phase: str
) -> None:
    tier = s3_tier_via(s3_bucket, proxy.endpoint)
    methods = ["PUT", "GET", "HEAD"] + (["DELETE"] if kind != "reset" else [])
    for method in methods:
        tier.put(method, b"payload")
        proxy.inject_next(kind, phase=phase, match=on(method))  # type: ignore[arg-type]
        if method == "PUT":
            tier.put(method, b"payload2")  # an overwrite: idempotent, retried
            assert tier.get(method) == b"payload2"
        elif method == "GET":
            assert tier.get(method) == b"payload"
        elif method == "HEAD":
            assert tier.head(method).size == 7
        else:
            assert tier.delete(method)
    assert proxy.total_injected == len(methods), proxy.injected


def test_delete_survives_a_connection_reset(s3_bucket: S3Bucket, proxy: FaultProxy) -> None:
    tier = s3_tier_via(s3_bucket, proxy.endpoint)
    tier.put("doomed", b"x")
    proxy.inject_next("reset", phase="before", match=on("DELETE"))  # type: ignore[arg-type]
    assert tier.delete("doomed")
    assert not tier.exists("doomed")


# --- create-only PUTs under faults (found by this proxy, now fixed) ---------------------------

# Create-only PUTs are not idempotent, so the client does not retry them, and a
# retry after a lost reply used to come back 412 as if another writer had won:
# tiers/s3/create.py retries and settles a 412 by comparing the stored bytes.


@pytest.mark.parametrize(
    ("kind", "phase"),
    [("reset", "before"), ("reset", "after"), ("timeout", "after"), ("truncate", "after")],
)
def test_create_put_survives_one_transient_fault(
    s3_bucket: S3Bucket, proxy: FaultProxy, kind: str, phase: str
) -> None:
    tier = s3_tier_via(s3_bucket, proxy.endpoint)
    proxy.inject_next(kind, phase=phase, match=lambda m, _t: m == "PUT")  # type: ignore[arg-type]
    tier.put("created", b"mine", mode=PutMode.CREATE)
    assert tier.get("created") == b"mine"
    with pytest.raises(ObjectExistsError):  # still create-only for everybody else
        tier.put("created", b"theirs", mode=PutMode.CREATE)


def test_one_replication_pass_survives_a_reset_on_the_manifest_put(
    tmp_path: Path, s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    store = two_tier_store(tmp_path, s3_tier_via(s3_bucket, proxy.endpoint))
    mouthguard.Checkpointer(store, run=RUN, background=False).save(1, state_of(1))
    proxy.inject_next("reset", phase="after", match=lambda m, t: m == "PUT" and MANIFEST_NAME in t)
    report = Replicator(store, store.policy).run_once()
    assert proxy.counts["reset"] == 1
    assert report.protected == 1 and not report.shortfalls, report.shortfalls


# --- (b) the object store is down --------------------------------------------------------


def test_store_down_saves_go_on_and_replication_catches_up(
    tmp_path: Path, s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    s3 = Watched(s3_tier_via(s3_bucket, proxy.endpoint, retry_timeout=2.0))
    store = two_tier_store(tmp_path, s3)
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    ckpt.save(1, state_of(1))
    assert Replicator(store, store.policy).run_once().protected == 1
    proxy.down()
    s3.asked.clear()
    for step in (2, 3, 4):
        info = ckpt.save(step, state_of(step))
        assert info.copies[0].tier == "fast"
    assert s3.asked == [], "a save asked the object store, so it could wait on it"
    report = Replicator(store, store.policy).run_once()  # never raises for a failing tier
    assert report.shortfalls and not report.copies
    assert s3.asked  # the watch sees what replication asks, so its silence above counts
    with pytest.raises(TierError):  # really down: refused, after the tier's retries
        store.tier("s3").head(file_keys(store.fast, 1)[0])
    proxy.up()
    reports = replicate_until_done(store, [1, 2, 3, 4])
    assert reports[-1].protected == 4 and not reports[-1].shortfalls, reports[-1].shortfalls
    clean = s3_tier_via(s3_bucket, s3_bucket.server.endpoint)
    assert_replicated_exactly(store.fast, clean, [1, 2, 3, 4])
    for step in (1, 2, 3, 4):
        assert_same(ckpt.load(step).state, state_of(step))


def test_replication_pass_while_down_reports_shortfalls(
    tmp_path: Path, s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    store = two_tier_store(tmp_path, s3_tier_via(s3_bucket, proxy.endpoint, retry_timeout=2.0))
    mouthguard.Checkpointer(store, run=RUN, background=False).save(1, state_of(1))
    proxy.down()
    report = Replicator(store, store.policy).run_once()  # a failing tier is a shortfall
    assert report.shortfalls and report.protected == 0 and not report.copies
    proxy.up()
    assert Replicator(store, store.policy).run_once().protected == 1


def test_load_from_the_fast_tier_while_the_object_store_is_down(
    tmp_path: Path, s3_bucket: S3Bucket, proxy: FaultProxy
) -> None:
    store = two_tier_store(tmp_path, s3_tier_via(s3_bucket, proxy.endpoint, retry_timeout=2.0))
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
    ckpt.save(1, state_of(1))
    proxy.down()
    loaded = ckpt.load()
    assert loaded.step == 1 and loaded.tier == "fast"
    assert_same(loaded.state, state_of(1))
