"""The dashboard as a Starlette application: the page, ``/api/...`` JSON and ``/metrics``.

Routes (every ``GET`` is served from the cached snapshot, never from the tiers,
except ``/api/datasets`` which opens each named dataset's manifest):

====================================================  ========================================
``GET /``                                             the page (``static/index.html``)
``GET /static/{file}``                                its script and style, shipped in the package
``GET /metrics``                                      Prometheus text (:mod:`.metrics`)
``GET /api/summary``                                  counts, tiers, runs, pending totals
``GET /api/checkpoints``                              a page of rows; filters ``run``,
                                                      ``state``, ``importance``, ``held``;
                                                      ``offset``, ``limit`` (<= 500), ``order``
``GET /api/checkpoints/{run}/{step}``                 one row
``GET /api/timeline?run=R&limit=N``                   the run's newest N recorded saves
                                                      (default run: the one with the most)
``GET /api/pending?limit=N``                          what ``gc`` would do now, with reasons
                                                      (the first N, oldest first; totals)
``GET /api/datasets``, ``GET /api/kvcache``           the datasets and KV caches given
``GET /api/peers``                                    the peer memory given (:mod:`.peers`)
``POST /api/checkpoints/{run}/{step}/hold``           ``{"name", "reason"}``
``POST /api/checkpoints/{run}/{step}/release``        ``{"name"}``
``POST /api/checkpoints/{run}/{step}/importance``     ``{"level", "reason"}``
====================================================  ========================================

**Mutations** are refused (403) unless the application was built with a token
(``mouthguard serve --allow-mutations`` and ``$MOUTHGUARD_SERVE_TOKEN``); then
every ``POST`` must carry ``Authorization: Bearer <token>`` (401 otherwise),
compared in constant time, before any byte of the body is read; the body is
then read only up to 4 KiB (413 past it, or when a longer one is announced). A
header cannot be set by a cross-site form, so the token also stops cross-site
requests. The page asks for the token and keeps it
in the tab's memory only.

**Hosts.** Served on loopback, only loopback host names are answered (400
otherwise), so a web page elsewhere cannot read the API through a rebound DNS
name. Errors are JSON ``{"error": message}`` with 400 (bad parameters), 404
(no such checkpoint), 401/403 (above) or 413 (a body over 4 KiB).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mouthguard.checkpoint.surface import (
    Checkpointer,
    CheckpointInfo,
    RankGroup,
    validate_run,
    validate_step,
)
from mouthguard.dashboard import metrics
from mouthguard.dashboard.datasets import KVStats, dataset_rows, kvcache_rows
from mouthguard.dashboard.peers import peer_memory
from mouthguard.dashboard.snapshot import STATES, Row, summary
from mouthguard.dashboard.snapshot_cache import SnapshotCache
from mouthguard.errors import MouthguardError
from mouthguard.format.strict_json import StrictJsonError, parse
from mouthguard.policy.importance import Importance, parse_importance

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_PAGE = 500
MAX_TIMELINE = 5000
MAX_BODY = 4096
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


class ApiError(Exception):
    """A request that cannot be served: its HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sources:
    """What the page shows beside the store: datasets, live KV caches, peer memory.

    ``peers`` is the directory holding the node areas of ``PeerMemory`` (its
    ``path``), or None.
    """

    datasets: Sequence[str] = ()
    kvcache: Mapping[str, KVStats] = field(default_factory=dict)
    peers: str | None = None


def create_app(
    cache: SnapshotCache,
    *,
    token: str | None = None,
    sources: Sources | None = None,
    allowed_hosts: Sequence[str] = LOOPBACK_NAMES,
) -> Starlette:
    """The dashboard of ``cache``'s store; ``token`` enables mutations (module docstring)."""
    sources = sources or Sources()
    registry = metrics.registry_for(cache.latest, cache.now)
    api = _Api(cache, token, sources)

    async def index(_request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def scrape(_request: Request) -> Response:
        # A walk over every row: in the thread pool, so other requests are not held up.
        text = await run_in_threadpool(metrics.render, registry)
        return Response(text, media_type=metrics.CONTENT_TYPE)

    routes = [
        Route("/", index),
        Route("/metrics", scrape),
        Route("/api/summary", _json(api.summary)),
        Route("/api/checkpoints", _json(api.checkpoints)),
        Route("/api/checkpoints/{run}/{step:int}", _json(api.checkpoint)),
        Route("/api/timeline", _json(api.timeline)),
        Route("/api/pending", _json(api.pending)),
        Route("/api/datasets", _json(api.datasets)),
        Route("/api/kvcache", _json(api.kvcache)),
        Route("/api/peers", _json(api.peers)),
        Route(
            "/api/checkpoints/{run}/{step:int}/{verb}",
            _json(api.mutate, authorize=api.authorize),
            methods=["POST"],
        ),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware)


def _json(
    handler: Callable[[Request], Any], *, authorize: Callable[[Request], None] | None = None
) -> Callable[[Request], Any]:
    """Wrap an API handler: its value as JSON, an :class:`ApiError` as ``{"error"}``.

    Handlers are synchronous (they read files, or take the snapshot's lock);
    Starlette runs them in its thread pool through ``run_in_threadpool``. A
    ``POST`` is first checked by ``authorize`` from its headers alone; only then is its
    body read, never past :data:`MAX_BODY` bytes: a client without the token
    cannot make the server buffer anything, and one with it at most 4 KiB.
    """

    async def endpoint(request: Request) -> Response:
        try:
            if authorize is not None:
                authorize(request)
            request.state.body = await _capped_body(request) if request.method == "POST" else b""
            value = await run_in_threadpool(handler, request)
        except ApiError as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return JSONResponse(value, headers={"Cache-Control": "no-store"})

    return endpoint


async def _capped_body(request: Request) -> bytes:
    """The request body, read only while it stays within :data:`MAX_BODY` bytes.

    Raises:
        ApiError: 413 as soon as the declared length or the bytes received pass it.
    """
    too_big = ApiError(413, f"body over {MAX_BODY} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise too_big  # (the HTTP server has already refused a malformed length)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise too_big
    return bytes(body)


class _Api:
    """The handlers of the ``/api`` routes (see the module docstring)."""

    def __init__(self, cache: SnapshotCache, token: str | None, sources: Sources) -> None:
        self.cache = cache
        self.token = token
        self.sources = sources

    def summary(self, _request: Request) -> Row:
        body = summary(self.cache.latest(), now=self.cache.now())
        body["mutations"] = self.token is not None
        body["datasets"] = len(self.sources.datasets)
        body["kvcaches"] = len(self.sources.kvcache)
        body["peers"] = self.sources.peers
        return body

    def checkpoints(self, request: Request) -> Row:
        q = request.query_params
        rows: Sequence[Row] = self.cache.latest().rows
        if "run" in q:
            rows = [r for r in rows if r["run"] == q["run"]]
        if "state" in q:
            state = _choice("state", q["state"], STATES)
            rows = [r for r in rows if r["state"] == state]
        if "importance" in q:
            level = _choice("importance", q["importance"], [i.value for i in Importance])
            rows = [r for r in rows if r["importance"] == level]
        if "held" in q:
            held = _choice("held", q["held"], ["true", "false"]) == "true"
            rows = [r for r in rows if r["held"] == held]
        order = _choice("order", q.get("order", "desc"), ["asc", "desc"])
        offset = _integer(q, "offset", 0, 0, None)
        limit = _integer(q, "limit", 100, 1, MAX_PAGE)
        ordered = rows if order == "asc" else rows[::-1]
        return {
            "total": len(rows),
            "offset": offset,
            "rows": list(ordered[offset : offset + limit]),
        }

    def checkpoint(self, request: Request) -> Row:
        run, step = request.path_params["run"], request.path_params["step"]
        row = self.cache.latest().row(run, step)
        if row is None:
            raise ApiError(404, f"no checkpoint {run} step {step}")
        return row

    def timeline(self, request: Request) -> Row:
        q = request.query_params
        snapshot = self.cache.latest()
        limit = _integer(q, "limit", 1000, 1, MAX_TIMELINE)
        saved = [r for r in snapshot.rows if r["save"] is not None]
        run = q.get("run") or _busiest_run(saved)
        points = [
            {
                "step": r["step"],
                "created": r["created"],
                "importance": r["importance"],
                "nbytes": r["nbytes"],
                **r["save"],
            }
            for r in saved
            if r["run"] == run
        ]
        return {"run": run, "total": len(points), "saves": points[-limit:]}

    def pending(self, request: Request) -> Row:
        snapshot = self.cache.latest()
        limit = _integer(request.query_params, "limit", 200, 1, MAX_PAGE)
        deleting = [
            {
                "run": r["run"],
                "step": r["step"],
                "importance": r["importance"],
                "reasons": r["retention"]["reasons"],
            }
            for r in snapshot.rows
            if r["retention"]["verdict"] == "delete"
        ]
        # Oldest first, as gc lists them; a store far behind on retention has thousands.
        return {
            "total_checkpoints": len(deleting),
            "total_actions": len(snapshot.pending),
            "checkpoints": deleting[:limit],
            "actions": list(snapshot.pending[:limit]),
        }

    def datasets(self, _request: Request) -> list[Row]:
        return dataset_rows(self.sources.datasets)

    def kvcache(self, _request: Request) -> list[Row]:
        return kvcache_rows(self.sources.kvcache)

    def peers(self, _request: Request) -> Row:
        if self.sources.peers is None:
            raise ApiError(404, "no peer memory given: start mouthguard serve with --peers")
        return peer_memory(self.sources.peers)

    def mutate(self, request: Request) -> Row:
        """Apply one mutation; the caller has already run :meth:`authorize`."""
        run, step, verb = (request.path_params[k] for k in ("run", "step", "verb"))
        body = _body(request.state.body)
        try:
            validate_run(run)
            validate_step(step)
            # This process alone: embedded in rank 0 of a job, a request thread must
            # never join (or build) a process group the other ranks are not in.
            ckpt = Checkpointer(self.cache.store, run, background=False, group=RankGroup())
            if ckpt.info(step, missing_ok=True) is None:
                raise ApiError(404, f"no readable checkpoint {run} step {step}")
            result = self._apply(ckpt, step, verb, body)
        except (ValueError, MouthguardError) as exc:
            raise ApiError(400, str(exc)) from None
        self.cache.refresh()
        log.warning("dashboard %s on %s step %d: %s", verb, run, step, result)
        return result

    def _apply(self, ckpt: Checkpointer, step: int, verb: str, body: dict[str, str]) -> Row:
        reason = body.get("reason") or "set through mouthguard serve"
        if verb == "hold":
            info = ckpt.hold(step, body.get("name", "hold"), reason=reason)
            return {"done": True, **_facts(info)}
        if verb == "release":
            released = ckpt.release(step, body.get("name", "hold"))
            after = ckpt.info(step)
            assert after is not None  # info() without missing_ok raises instead
            return {"done": released, **_facts(after)}
        if verb == "importance":
            level = parse_importance(body.get("level", ""))
            info = ckpt.set_importance(step, level, reason=reason)
            return {"done": True, **_facts(info)}
        raise ApiError(404, f"no action {verb!r}: hold, release or importance")

    def authorize(self, request: Request) -> None:
        """Refuse (403/401) unless mutations are enabled and the request carries the token."""
        if self.token is None:
            raise ApiError(
                403, "read-only: start mouthguard serve with --allow-mutations to change facts"
            )
        given = request.headers.get("authorization", "")
        scheme, _, credential = given.partition(" ")
        valid = hmac.compare_digest(credential.strip().encode(), self.token.encode())
        if scheme.lower() != "bearer" or not valid:
            raise ApiError(401, "a valid 'Authorization: Bearer <token>' header is required")


def _busiest_run(saved: Sequence[Row]) -> str | None:
    """The run with the most recorded saves, the newest save breaking ties (None: no saves).

    Not simply the run of the newest save: a two-save side run (a diverged branch,
    an evaluation) would hide the training run the page is opened to watch.
    """
    counts: dict[str, int] = {}
    newest: dict[str, str] = {}
    for r in saved:
        counts[r["run"]] = counts.get(r["run"], 0) + 1
        newest[r["run"]] = max(newest.get(r["run"], ""), r["created"] or "")
    return max(counts, key=lambda run: (counts[run], newest[run]), default=None)


def _facts(info: CheckpointInfo) -> Row:
    return {
        "run": info.run,
        "step": info.step,
        "importance": info.importance.value,
        "holds": list(info.holds),
    }


def _body(raw: bytes) -> dict[str, str]:
    """A mutation's body: a flat JSON object of strings (empty body: no fields)."""
    if not raw.strip():
        return {}
    try:
        value = parse(raw, max_depth=1, max_bytes=MAX_BODY, source="the request body")
    except StrictJsonError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ApiError(400, "the body must be a JSON object of strings")
    return {k: str(v) for k, v in value.items()}


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ApiError(400, f"{name} must be one of {', '.join(choices)}: {value!r}")
    return value


def _integer(q: Mapping[str, str], name: str, default: int, low: int, high: int | None) -> int:
    text = q.get(name)
    if text is None:
        return default
    try:
        value = int(text, 10)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer: {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" + ("" if high is None else f" and <= {high}")
        raise ApiError(400, f"{name} must be {bound}: {text!r}")
    return value
