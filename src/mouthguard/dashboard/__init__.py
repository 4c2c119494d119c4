"""The operator's view of a store: a web page, ``/api`` JSON and Prometheus ``/metrics``.

``mouthguard serve`` runs it; an application can embed it (to show its live KV
caches too)::

    from mouthguard.dashboard import DashboardThread, SnapshotCache, Sources, create_app

    cache = SnapshotCache(store)
    app = create_app(cache, sources=Sources(kvcache={"llama": kv.stats}))
    with DashboardThread(app, port=8000) as served:
        print(served.address.url)

Needs the ``serve`` extra (starlette, uvicorn, prometheus-client). Modules:
:mod:`.snapshot` (one read of the store, judged by the CLI's own functions),
:mod:`.cache` (keeps it fresh off the request path), :mod:`.metrics`,
:mod:`.datasets`, :mod:`.app` (routes, the mutation token), :mod:`.server`.
"""

from __future__ import annotations

from mouthguard.dashboard.app import Sources, create_app
from mouthguard.dashboard.server import Address, DashboardThread
from mouthguard.dashboard.snapshot_cache import SnapshotCache

__all__ = ["Address", "DashboardThread", "SnapshotCache", "Sources", "create_app"]
