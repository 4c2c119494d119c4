"""Datasets and KV caches beside the checkpoints: what the page lists when it is given some.

A store does not know its datasets (a dataset names its own place), so
``mouthguard serve --dataset LOCATION`` names them; each is opened as the loader
opens it (:func:`~mouthguard.data.dataset.open_dataset`: its manifest's seal, and
its signature with a key) on every request, which reads one small object. A
dataset that cannot be opened is listed with the reason, never dropped.

KV caches live inside an inference process (their counters are in memory), so
only an application that embeds the dashboard can show them: it passes each
store's ``stats`` method (:meth:`mouthguard.kvcache.KVStore.stats`) by name.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mouthguard.data.dataset import open_dataset
from mouthguard.errors import MouthguardError

#: A KV cache's statistics: per tier (``memory``, ``disk``, ``remote``) its figures.
KVStats = Callable[[], Mapping[str, Mapping[str, Any]]]


def dataset_rows(locations: Sequence[str]) -> list[dict[str, Any]]:
    """One row per dataset location: its manifest's figures, or why it cannot be opened."""
    rows: list[dict[str, Any]] = []
    for location in locations:
        try:
            manifest = open_dataset(location).manifest
        except (MouthguardError, ValueError, OSError) as exc:  # a bad URL, a missing mount
            rows.append({"location": location, "error": str(exc)})
            continue
        rows.append(
            {
                "location": location,
                "error": None,
                "name": manifest.name,
                "kind": manifest.kind,
                "layout": manifest.layout,
                "created": manifest.created.astimezone(dt.UTC).isoformat(),
                "units": len(manifest.counts),
                "samples": manifest.samples,
                "nbytes": manifest.nbytes,
                "fingerprint": manifest.fingerprint,
                "signed": manifest.signed,
            }
        )
    return rows


def kvcache_rows(caches: Mapping[str, KVStats]) -> list[dict[str, Any]]:
    """One row per KV cache and tier: its counters as ``KVStore.stats`` reports them."""
    rows: list[dict[str, Any]] = []
    for name, stats in sorted(caches.items()):
        for tier, figures in stats().items():
            rows.append({"cache": name, "tier": tier, **figures})
    return rows
