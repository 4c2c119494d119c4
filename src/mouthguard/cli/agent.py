"""``mouthguard agent``: the node agent, replication passes in the foreground until stopped.

One summary line per pass on stdout (``--json``: one JSON line per event: the
start, each pass, the stop), new shortfalls on stderr. It always exits 0 once
stopped, by its pass limit or a signal (:mod:`mouthguard.cli.common`; 2 for
usage errors).

Each replication pass runs in a worker thread so that the main thread stays
free to take SIGINT/SIGTERM at any moment: a signal stops the agent after the
checkpoint in flight (or after ``--stop-grace`` seconds at most; a second
signal stops it at once). A copy cut off that way leaves only invisible staging
debris on the destination, collected like any interrupted save, so stopping
early never damages a copy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

from rich.console import Console

from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import COUNT, EXIT_OK, POSITIVE, Handler
from mouthguard.cli.render import error_console, human_bytes
from mouthguard.jobs.replicator import ReplicationReport, Replicator


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``agent``."""
    agent = sub.add_parser("agent", help="node agent: replication passes in the foreground")
    add = agent.add_argument
    add("--interval", type=POSITIVE, default=30.0, help="seconds between passes")
    add("--once", action="store_true", help="one pass, then exit")
    add("--max-passes", type=COUNT, default=None, help="stop after N passes")
    budget = "seconds after which a pass starts no new checkpoint (the rest waits a pass)"
    add("--pass-budget", type=POSITIVE, default=600.0, help=budget)
    grace = "on SIGINT/SIGTERM, seconds to let the copy in flight finish (2nd signal: none)"
    add("--stop-grace", type=POSITIVE, default=10.0, help=grace)
    add("--json", action="store_true", help="print JSON lines: the start, each pass, the stop")


@dataclass
class _Stop:
    """Set by SIGINT/SIGTERM: ``requested`` on the first signal, ``forced`` on the next.

    Plain flags, not ``threading.Event``: ``Event.set`` takes a lock that the
    interrupted main thread may be holding, so calling it from a signal
    handler can deadlock. Reading a bool from another thread is safe.
    """

    requested: bool = False
    forced: bool = False

    def signal(self) -> None:
        """Record one signal (called from the handler: no locks, no I/O)."""
        self.forced = self.requested
        self.requested = True

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when a stop is requested (checked every 0.1 s)."""
        until = time.monotonic() + seconds
        while not self.requested and (left := until - time.monotonic()) > 0:
            time.sleep(min(0.1, left))


@dataclass
class _Pass:
    """One agent pass: filled in by the worker thread, read by the main thread."""

    report: ReplicationReport = field(default_factory=ReplicationReport)
    visited: int = 0
    total: int = 0
    error: str | None = None
    abandoned: bool = False
    seconds: float = 0.0


@contextlib.contextmanager
def _signals_to(stop: _Stop) -> Iterator[None]:
    """Route SIGINT and SIGTERM to ``stop`` while the agent runs; restore them after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python delivers signals to the main thread only: the caller owns them
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.signal()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _work(replicator: Replicator, stop: _Stop, budget: float, result: _Pass) -> None:
    """The body of one pass (worker thread). Never raises: a daemon outlives a bad pass."""
    deadline = time.monotonic() + budget
    try:
        result.total = len(replicator.targets())

        def visited(_run: str, _step: int) -> None:
            result.visited += 1

        # The stop is checked between checkpoints only: a copy is never cut off on purpose.
        replicator.run_once(
            on_checkpoint=visited,
            should_stop=lambda: stop.requested or time.monotonic() >= deadline,
            report=result.report,
        )
    except Exception as exc:  # noqa: BLE001 - e.g. a tier that cannot list: retry next pass
        result.error = f"{type(exc).__name__}: {exc}"


def _one_pass(replicator: Replicator, stop: _Stop, budget: float, grace: float) -> _Pass:
    """Run a pass in a worker thread; return when it ends or a stop cuts it off."""
    result = _Pass()
    started = time.monotonic()
    # A thread of its own, not io.pool.SHARED: a pass copies through the tiers, whose
    # large writes wait on SHARED; this thread only lets the caller see signals.
    worker = threading.Thread(
        target=_work, args=(replicator, stop, budget, result), name="mouthguard-agent", daemon=True
    )
    worker.start()
    stop_seen: float | None = None
    # join() with a timeout lets signal handlers run between waits.
    while worker.is_alive():
        worker.join(0.1)
        if stop.forced:
            break
        if stop.requested:
            stop_seen = stop_seen if stop_seen is not None else time.monotonic()
            if time.monotonic() - stop_seen >= grace:
                break
    result.abandoned = worker.is_alive()
    result.seconds = time.monotonic() - started
    return result


def _pass_line(number: int, result: _Pass) -> str:
    report = result.report
    line = (
        f"pass {number} {time.strftime('%H:%M:%S')}: {report.checked} checked, "
        f"{report.protected} protected, {len(report.copies)} copies "
        f"({human_bytes(report.copied_bytes)}), {len(report.shortfalls)} shortfalls, "
        f"{result.seconds:.2f} s"
    )
    deferred = result.total - result.visited
    if deferred > 0 and result.error is None:
        line += f", {deferred} not reached (left for a later pass)"
    if result.abandoned:
        line += ", cut off by the stop"
    if result.error is not None:
        line += f", FAILED: {result.error}"
    return line


def _pass_json(number: int, result: _Pass) -> dict[str, object]:
    """The ``--json`` form of :func:`_pass_line` (shortfalls listed, not counted)."""
    report = result.report
    deferred = result.total - result.visited if result.error is None else 0
    return {
        "event": "pass",
        "pass": number,
        "checked": report.checked,
        "protected": report.protected,
        "copies": len(report.copies),
        "copied_bytes": report.copied_bytes,
        "shortfalls": [
            {"run": s.run, "step": s.step, "reason": s.reason} for s in report.shortfalls
        ],
        "not_reached": max(deferred, 0),
        "cut_off": result.abandoned,
        "error": result.error,
        "seconds": round(result.seconds, 6),
    }


def _agent(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Replication passes until the pass limit or a signal; always exit 0 when stopped.

    Contract: one summary line per pass on stdout (flushed), new shortfalls on
    stderr; a pass starts no checkpoint after ``--pass-budget`` seconds or once
    a stop is requested; the sleep between passes ends within 0.1 s of a
    signal; the agent returns at most ``--stop-grace`` seconds after the first
    signal, at once after a second one. A copy that is still running then is
    abandoned in its daemon thread and dies with the process (invisible debris).
    """
    err = error_console()
    limit: int | None = 1 if args.once else args.max_passes
    replicator = Replicator(store, store.policy)
    stop = _Stop()
    tiers = ", ".join(f"{t.name} ({t.domain})" for t in store.tiers)
    passes = 0
    seen: set[str] = set()

    def log(line: str, event: dict[str, object]) -> None:
        _say(console, json.dumps(event) if args.json else line)

    with _signals_to(stop):
        log(
            f"mouthguard agent on {store.source}: tiers {tiers}; every {args.interval:g} s",
            {
                "event": "start",
                "store": store.source,
                "tiers": [{"name": t.name, "domain": t.domain} for t in store.tiers],
                "interval_seconds": args.interval,
            },
        )
        while not stop.requested:
            passes += 1
            result = _one_pass(replicator, stop, args.pass_budget, args.stop_grace)
            log(_pass_line(passes, result), _pass_json(passes, result))
            # Shortfalls go to stderr, once each until they clear, so stdout stays one line a pass.
            now = {f"{s.run} step {s.step}: {s.reason}" for s in result.report.shortfalls}
            for line in sorted(now - seen):
                _say(err, f"shortfall: {line}")
            seen = now
            if limit is not None and passes >= limit:
                break
            stop.sleep(args.interval)
    reason = "stop requested" if stop.requested else "pass limit reached"
    log(
        f"agent stopped after {passes} passes ({reason})",
        {"event": "stop", "passes": passes, "reason": reason},
    )
    return EXIT_OK


def _say(console: Console, line: str) -> None:
    """Print one log line and flush it: a supervisor reading a pipe sees it at once."""
    console.print(line, highlight=False, soft_wrap=True, markup=False)
    console.file.flush()


HANDLERS: dict[str, Handler] = {"agent": _agent}

__all__ = ["HANDLERS", "add_parser"]
