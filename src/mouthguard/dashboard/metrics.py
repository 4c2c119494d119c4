"""``/metrics``: the snapshot as Prometheus series, through prometheus-client.

Every series is a gauge computed from the latest :class:`~.snapshot.Snapshot`
at scrape time (a custom collector: nothing is counted in between, so a
restarted server reports the same values). All are prefixed ``mouthguard_``:

=============================================  ===========================================
series                                         value
=============================================  ===========================================
``checkpoints{state,importance}``              checkpoints in each state and importance
                                               (``unknown`` importance: manifest unreadable)
``unprotected_bytes{importance}``              bytes of checkpoints committed or verified
                                               but not yet protected (one copy's size each;
                                               trashed and damaged ones excluded)
``replication_lag_seconds{run}``               age of the run's oldest unprotected
                                               checkpoint (0 when every one is protected)
``last_save_stall_seconds{run}``               how long the run's newest recorded save
                                               blocked training
``last_save_seconds{run}``                     how long that save took until its manifest
``damaged_copies{tier}``                       copies on the tier that a reader found
                                               damaged (a standing damage report, or an
                                               unreadable manifest); also exported under
                                               its old name ``verification_failures``
                                               for one release (:data:`RENAMED`)
``pending_actions{action}``                    copy actions retention would take now
``held_checkpoints``                           checkpoints under at least one hold
``snapshot_age_seconds``                       age of the store read these come from
``snapshot_build_seconds``                     how long that read took
=============================================  ===========================================

A save recorded before manifests carried their timing (or written through
DCP) has no stall; a run without any has no ``last_save_*`` sample.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mouthguard.dashboard.snapshot import STATES, Snapshot, is_unprotected
from mouthguard.policy.importance import Importance

PREFIX = "mouthguard_"
#: Old series name -> new, both exported with the same samples for one release, so
#: an alert on the old name keeps firing (a series that vanishes alerts nobody).
RENAMED = {"verification_failures": "damaged_copies"}
#: The ``Content-Type`` of the text exposition format that :func:`render` produces.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SnapshotCollector(Collector):
    """Collects the gauges of the module docstring from ``latest()`` at each scrape."""

    def __init__(self, latest: Callable[[], Snapshot], now: Callable[[], dt.datetime]) -> None:
        self._latest = latest
        self._now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One family per series; labels are always present, values may be empty."""
        snapshot = self._latest()
        yield _checkpoints(snapshot)
        yield _unprotected(snapshot)
        yield from _per_run(snapshot, self._now())
        yield from _damaged(snapshot)
        pending = GaugeMetricFamily(
            PREFIX + "pending_actions",
            "Copy actions retention would take now (what `mouthguard gc` would do).",
            labels=["action"],
        )
        for action in ("trash", "purge", "demote", "restore"):
            count = sum(p["action"] == action for p in snapshot.pending)
            pending.add_metric([action], count)
        yield pending
        yield GaugeMetricFamily(
            PREFIX + "held_checkpoints",
            "Checkpoints under at least one hold (never deleted).",
            value=sum(r["held"] for r in snapshot.rows),
        )
        age = (self._now() - snapshot.taken_at).total_seconds()
        yield GaugeMetricFamily(
            PREFIX + "snapshot_age_seconds",
            "Age of the store read these series come from.",
            value=max(0.0, age),
        )
        yield GaugeMetricFamily(
            PREFIX + "snapshot_build_seconds",
            "How long reading and judging the store took.",
            value=snapshot.build_seconds,
        )


def _checkpoints(snapshot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        PREFIX + "checkpoints",
        "Checkpoints per state and importance.",
        labels=["state", "importance"],
    )
    counts: dict[tuple[str, str], int] = {
        (state, level.value): 0 for state in STATES for level in Importance
    }
    for row in snapshot.rows:
        key = (row["state"], row["importance"] or "unknown")
        counts[key] = counts.get(key, 0) + 1
    for (state, level), count in sorted(counts.items()):
        family.add_metric([state, level], count)
    return family


def _unprotected(snapshot: Snapshot) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        PREFIX + "unprotected_bytes",
        "Bytes of committed checkpoints whose placement is not yet met and verified.",
        labels=["importance"],
    )
    totals = {level.value: 0 for level in Importance}
    for row in snapshot.rows:
        if is_unprotected(row):
            totals[row["importance"]] += row["nbytes"]
    for level, total in totals.items():
        family.add_metric([level], total)
    return family


def _per_run(snapshot: Snapshot, now: dt.datetime) -> Iterator[GaugeMetricFamily]:
    lag = GaugeMetricFamily(
        PREFIX + "replication_lag_seconds",
        "Age of the run's oldest unprotected checkpoint (0: every one is protected).",
        labels=["run"],
    )
    stall = GaugeMetricFamily(
        PREFIX + "last_save_stall_seconds",
        "How long the run's newest recorded save blocked the training loop.",
        labels=["run"],
    )
    took = GaugeMetricFamily(
        PREFIX + "last_save_seconds",
        "How long the run's newest recorded save took until its manifest was built.",
        labels=["run"],
    )
    oldest: dict[str, float] = {}
    last: dict[str, dict[str, float]] = {}
    for row in snapshot.rows:  # ascending by step within a run
        run = row["run"]
        oldest.setdefault(run, 0.0)
        if is_unprotected(row) and oldest[run] == 0.0:
            created = dt.datetime.fromisoformat(row["created"])
            oldest[run] = max(0.0, (now - created).total_seconds())
        if row["save"] is not None:
            last[run] = row["save"]
    for run, seconds in oldest.items():
        lag.add_metric([run], seconds)
    for run, save in last.items():
        stall.add_metric([run], save["stall_seconds"])
        took.add_metric([run], save["seconds"])
    yield from (lag, stall, took)


def _damaged(snapshot: Snapshot) -> Iterator[GaugeMetricFamily]:
    """Damaged copies present now, per tier, under the name and its deprecated old name."""
    counts = {str(t["name"]): 0 for t in snapshot.tiers}
    for row in snapshot.rows:
        for copy in row["copies"]:
            if copy["damage"]:
                counts[copy["tier"]] = counts.get(copy["tier"], 0) + 1
    help_text = (
        "Copies a reader found damaged (a standing damage report or an unreadable manifest)."
    )
    names = {"damaged_copies": help_text}
    names.update(
        (old, f"Deprecated name of {PREFIX}{new}, exported for one release. {help_text}")
        for old, new in RENAMED.items()
    )
    for name, text in names.items():
        family = GaugeMetricFamily(PREFIX + name, text, labels=["tier"])
        for tier, count in counts.items():
            family.add_metric([tier], count)
        yield family


def registry_for(
    latest: Callable[[], Snapshot], now: Callable[[], dt.datetime]
) -> CollectorRegistry:
    """A private registry holding only the snapshot's collector (no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(latest, now))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)
