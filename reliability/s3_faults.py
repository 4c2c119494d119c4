"""Object-store faults: saves, replication and loads through a fault-injecting proxy.

A throwaway Ceph RGW (the one the S3 tests start, :mod:`tests.s3.ceph`) sits
behind :class:`tests.s3.fault_proxy.FaultProxy`, which injects 500s, 503
SlowDown, timeouts, connection resets and truncated bodies at a set rate. A
store with a local fast tier and that S3 durable tier then runs rounds of:
saves (to the fast tier), one replication pass, and a load of the newest
checkpoint from S3 alone. In one round the object store is *down* (the proxy
refuses connections): saves must go on at fast-tier speed, and replication
must catch up once it is back.

What is counted:

* ``cases``: injected faults, plus one for the down/up episode.
* ``survived``: faults the S3 tier absorbed (retried) without an error reaching
  mouthguard; a fault that surfaced as a tier error (and needed a later
  replication pass to heal) is not survived. The episode survives if saves went
  on while down and every checkpoint was replicated after.
* ``accepted_corrupt``: loads that returned a state other than the one saved.
* ``lost_acknowledged``: saves that returned but whose checkpoint is not intact
  at the end on the fast tier and (read without the proxy) on S3.
* ``writes_outside``: entries in the run's scratch directory outside the fast tier.

Run: ``python -m reliability.run --only s3_faults --level ci``.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any

import torch
from tests.s3.ceph import CephCluster, CephStartError, S3Endpoint, missing_binaries
from tests.s3.fault_proxy import FaultProxy, FaultRates

import mouthguard
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError, ObjectNotFoundError, TierError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.base import OPERATIONS, Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.s3 import S3Tier
from reliability.record import HarnessResult, Level

HARNESS = "s3-faults"
#: The proxy's fault kinds, as the table words them.
FAULT_LABELS = {
    "error_500": "HTTP 500",
    "slow_down": "503 SlowDown",
    "timeout": "timeouts",
    "reset": "connection resets",
    "truncate": "truncated bodies",
}
EPISODE = "object store down, then up (one episode)"
COMMAND = "python -m reliability.run --only s3_faults --level {level}"
RUN = "r"
BUCKET = "mouthguard-s3-faults"
#: Client timeouts through the proxy; a timeout fault holds a request longer.
REQUEST_TIMEOUT = 1.0
TIMEOUT_DELAY = 1.5
MAX_CATCH_UP_PASSES = 10
#: A save to the local fast tier while the object store is down must not wait on it.
SAVE_WHILE_DOWN_LIMIT_S = 5.0
# Tier methods whose errors count as surfaced faults (outermost call only): every
# operation of the tier interface, and the S3 tier's own tag and hold calls.
_WATCHED = (*OPERATIONS, "set_tags", "get_tags", "legal_hold")


@dataclass(frozen=True)
class _Plan:
    rounds: int
    saves_per_round: int
    rate: float
    down_round: int
    seed: int


_PLANS: dict[str, _Plan] = {
    "ci": _Plan(rounds=4, saves_per_round=2, rate=0.08, down_round=2, seed=1),
    "soak": _Plan(rounds=30, saves_per_round=3, rate=0.1, down_round=10, seed=2),
}


class _Surfaced:
    """Counts tier errors that escape the S3 tier (while the store is up)."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.count = 0
        self.samples: Counter[str] = Counter()
        self._depth = threading.local()
        self._lock = threading.Lock()

    def watch(self, tier: S3Tier) -> None:
        for name in _WATCHED:
            setattr(tier, name, self._wrap(getattr(tier, name), name))

    def _wrap(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        @wraps(method)
        def watched(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            try:
                return method(*args, **kwargs)
            except TierError as exc:
                counted = depth == 0 and not isinstance(exc, ObjectNotFoundError)
                if counted and not self.proxy.is_down:
                    with self._lock:
                        self.count += 1
                        self.samples[f"{name}: {type(exc).__name__}: {_gist(exc)}"] += 1
                raise
            finally:
                self._depth.n = depth

        return watched


def _gist(exc: Exception) -> str:
    text = str(exc)
    for marker in ("error sending request", "already exists", "response body", "timed out"):
        if marker in text:
            return marker
    return text.rsplit(": ", maxsplit=1)[-1][:60]


def _state(step: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 1024, generator=generator), "b": torch.arange(5.0), "step": step}


def _digest(state: object) -> str:
    """A digest of a loaded or saved state (tensor bytes, dtypes, shapes, plain values)."""
    hasher = hashlib.sha256()

    def feed(value: object) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            hasher.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
            hasher.update(tensor.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value):
                hasher.update(f"K{key}".encode())
                feed(value[key])
        else:
            hasher.update(repr(value).encode())

    feed(state)
    return hasher.hexdigest()


def _s3_tier(endpoint: S3Endpoint, via: str, name: str = "s3") -> S3Tier:
    return S3Tier(
        f"s3://{BUCKET}/store",
        name=name,
        domain="region-a",
        endpoint=via,
        region=endpoint.region,
        access_key_id=endpoint.access_key,
        secret_access_key=endpoint.secret_key,
        backoff_initial=0.01,
        backoff_max=0.1,
        connect_timeout=REQUEST_TIMEOUT,
        request_timeout=REQUEST_TIMEOUT,
        retry_timeout=10.0,
    )


def _create_bucket(endpoint: S3Endpoint) -> None:
    import boto3  # noqa: PLC0415 - only this harness needs boto3 directly

    client = boto3.client(
        "s3",
        endpoint_url=endpoint.endpoint,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        region_name=endpoint.region,
    )
    client.create_bucket(Bucket=BUCKET)


def _file_keys(tier: Tier, step: int) -> list[str]:
    prefix = CopyRef(tier, RUN, step).prefix
    manifest = read_manifest(tier, RUN, step)
    return [prefix + name for name in [*(f.name for f in manifest.files), MANIFEST_NAME]]


def _intact_on_s3(fast: Tier, clean: S3Tier, step: int) -> bool:
    try:
        return all(clean.get(key) == fast.get(key) for key in _file_keys(fast, step))
    except MouthguardError:
        return False


def run(level: Level) -> HarnessResult:
    """Run the harness at ``level`` (``ci``: ~15 s; ``soak``: minutes)."""
    started = time.monotonic()
    command = COMMAND.format(level=level)
    # Without a server nothing is exercised: the result says "not run", never
    # "passed" with zero cases.
    if missing := missing_binaries():
        why = (
            f"no S3 server: Ceph RGW is not installed (missing {', '.join(missing)}); "
            "install it with `make system-deps`"
        )
        return HarnessResult.skipped(HARNESS, why, command=command)
    plan = _PLANS[level]
    try:
        with CephCluster() as endpoint, tempfile.TemporaryDirectory() as scratch:
            _create_bucket(endpoint)
            result = _exercise(plan, endpoint, Path(scratch))
    except CephStartError as exc:
        why = f"no S3 server: the Ceph RGW did not start: {str(exc).splitlines()[0]}"
        return HarnessResult.skipped(HARNESS, why, command=command)
    result.command = command
    result.seconds = round(time.monotonic() - started, 2)
    return result


@dataclass
class _Tally:
    """What the rounds, the catch-up and the final judgement found."""

    acknowledged: dict[int, str] = field(default_factory=dict)  # step -> digest of its state
    accepted_corrupt: int = 0
    load_failures: int = 0
    pass_errors: int = 0
    shortfalls: int = 0
    slowest_save_while_down: float = 0.0
    episode_ok: bool = True
    catch_up_passes: int = 0
    lost: int = 0
    replicated: int = 0


def _exercise(plan: _Plan, endpoint: S3Endpoint, scratch: Path) -> HarnessResult:
    tally = _Tally()
    with FaultProxy(endpoint.endpoint, seed=plan.seed, timeout_delay=TIMEOUT_DELAY) as proxy:
        # Tiers open (and probe the bucket) before the faults start.
        s3 = _s3_tier(endpoint, proxy.endpoint)
        reader_tier = _s3_tier(endpoint, proxy.endpoint)
        clean = _s3_tier(endpoint, endpoint.endpoint, name="clean")
        surfaced = _Surfaced(proxy)
        surfaced.watch(s3)
        surfaced.watch(reader_tier)
        store = Store([LocalTier(scratch / "fast", name="fast", domain="node-a"), s3])
        reader = mouthguard.Checkpointer(Store([reader_tier]), run=RUN, background=False)
        ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
        proxy.set_rates(FaultRates.uniform(plan.rate))
        _rounds(plan, proxy, store, ckpt, reader, tally)
        _catch_up(store, tally)
        proxy.set_rates(FaultRates())
        counts, phases, injected = proxy.counts, proxy.phase_counts, proxy.total_injected
        requests = proxy.requests
    _judge(store, clean, tally)
    tally.episode_ok = (
        tally.episode_ok
        and tally.slowest_save_while_down < SAVE_WHILE_DOWN_LIMIT_S
        and tally.replicated == len(tally.acknowledged)
    )
    details: dict[str, Any] = {
        "rate": plan.rate,
        "seed": plan.seed,
        "rounds": plan.rounds,
        "faults_by_kind": counts,
        "faults_by_phase": phases,
        "requests": requests,
        "saves_acknowledged": len(tally.acknowledged),
        "replicated_byte_exact": tally.replicated,
        "surfaced_tier_errors": surfaced.count,
        "surfaced_samples": dict(surfaced.samples.most_common(8)),
        "replication_shortfalls": tally.shortfalls,
        "replication_passes_raised": tally.pass_errors,
        "catch_up_passes": tally.catch_up_passes,
        "load_failures": tally.load_failures,
        "down_episode_ok": tally.episode_ok,
        "slowest_save_while_down_s": round(tally.slowest_save_while_down, 3),
    }
    by_kind = {FAULT_LABELS.get(kind, kind): n for kind, n in counts.items() if n}
    return HarnessResult(
        HARNESS,
        what=(
            f"{plan.rounds} rounds of saves, replication to S3 and loads from S3 through a "
            f"proxy injecting 500/503 SlowDown/timeouts/resets/truncated bodies at "
            f"{plan.rate:.0%} of requests, plus one object-store-down episode; one case "
            "is one injected fault (survived: absorbed by the S3 tier's retries, no error "
            "surfaced) or the episode"
        ),
        cases=injected + 1,
        cases_by_kind={**by_kind, EPISODE: 1},
        acknowledged=len(tally.acknowledged),
        survived=max(0, injected - surfaced.count) + int(tally.episode_ok),
        accepted_corrupt=tally.accepted_corrupt,
        lost_acknowledged=tally.lost,
        writes_outside=len([p for p in scratch.iterdir() if p.name != "fast"]),
        details=details,
    )


def _rounds(
    plan: _Plan,
    proxy: FaultProxy,
    store: Store,
    ckpt: mouthguard.Checkpointer,
    reader: mouthguard.Checkpointer,
    tally: _Tally,
) -> None:
    """Saves, a replication pass and a load from S3 per round; S3 down for one round."""
    step = 0
    for round_no in range(plan.rounds):
        down = round_no == plan.down_round
        if down:
            proxy.down()
        for _ in range(plan.saves_per_round):
            step += 1
            _save(ckpt, step, down, tally)
        try:
            report = Replicator(store, store.policy).run_once()
            tally.shortfalls += len(report.shortfalls)
        except MouthguardError:
            tally.pass_errors += 1
        if down:
            proxy.up()
            continue
        newest = max(tally.acknowledged, default=None)
        if newest is not None and reader.exists(newest):
            try:
                loaded = reader.load(newest)
            except MouthguardError:
                tally.load_failures += 1
            else:
                if _digest(loaded.state) != tally.acknowledged[newest]:
                    tally.accepted_corrupt += 1


def _save(ckpt: mouthguard.Checkpointer, step: int, down: bool, tally: _Tally) -> None:
    state = _state(step)
    began = time.monotonic()
    try:
        ckpt.save(step, state, importance="routine")
    except MouthguardError:
        tally.episode_ok = tally.episode_ok and not down
        return
    if down:
        tally.slowest_save_while_down = max(tally.slowest_save_while_down, time.monotonic() - began)
    tally.acknowledged[step] = _digest(state)


def _catch_up(store: Store, tally: _Tally) -> None:
    """Replication passes, faults still on, until every acknowledged save is protected."""
    for passes in range(1, MAX_CATCH_UP_PASSES + 1):
        tally.catch_up_passes = passes
        try:
            report = Replicator(store, store.policy).run_once()
        except MouthguardError:
            tally.pass_errors += 1
            continue
        if report.protected == len(tally.acknowledged) and not report.shortfalls:
            break


def _judge(store: Store, clean: S3Tier, tally: _Tally) -> None:
    """Every acknowledged save, read back with the faults off and no proxy at all."""
    fast_reader = mouthguard.Checkpointer(Store([store.fast]), run=RUN, background=False)
    clean_reader = mouthguard.Checkpointer(Store([clean]), run=RUN, background=False)
    for saved, digest in tally.acknowledged.items():
        on_s3 = _intact_on_s3(store.fast, clean, saved)
        tally.replicated += on_s3
        intact = 0
        for source in [fast_reader] + ([clean_reader] if on_s3 else []):
            try:
                loaded = source.load(saved)
            except MouthguardError:
                continue
            if _digest(loaded.state) != digest:
                tally.accepted_corrupt += 1
            else:
                intact += 1
        tally.lost += intact == 0


if __name__ == "__main__":  # pragma: no cover - a convenience for running it alone
    import json
    import sys

    outcome = run("soak" if "--soak" in sys.argv else "ci")
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(outcome.to_json(), indent=2, sort_keys=True))
