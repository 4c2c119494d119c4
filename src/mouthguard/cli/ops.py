"""``mouthguard hold|release|promote|replicate|agent``: act on checkpoints and their copies.

``demote`` and ``importance`` (the command's earlier name) are aliases of
``promote``: each sets any level, up or down.

With ``--json`` each command prints one JSON object saying what happened
(``agent``: one JSON line per event: its start, each pass, its stop).

Exit codes follow :mod:`mouthguard.cli.main`: 0 success; 1 the command ran but
its goal is not met (no such hold to release, a checkpoint left unprotected);
2 usage errors, including a run or step that names no readable checkpoint
(raised as :class:`UnknownCheckpointError`, a ``ValueError``, which ``main``
turns into exit 2).

The agent runs each replication pass in a worker thread so that the main
thread stays free to take SIGINT/SIGTERM at any moment: a signal stops the
agent after the checkpoint in flight (or after ``--stop-grace`` seconds at
most; a second signal stops it at once). A copy cut off that way leaves only
invisible staging debris on the destination, collected like any interrupted
save, so stopping early never damages a copy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.gathering import gather
from mouthguard.checkpoint.info import CheckpointInfo
from mouthguard.checkpoint.store import Store
from mouthguard.cli.argtypes import COUNT, POSITIVE, STEP
from mouthguard.cli.render import error_console, human_bytes
from mouthguard.jobs.replicator import ReplicationReport, Replicator
from mouthguard.policy.importance import parse_importance
from mouthguard.policy.placement import protection_status

EXIT_OK, EXIT_NOT_MET = 0, 1

#: A subcommand handler: ``(store, parsed arguments, stdout console) -> exit code``.
Handler = Callable[[Store, argparse.Namespace, Console], int]


class UnknownCheckpointError(ValueError):
    """A run or step names no readable checkpoint (a usage error: exit code 2)."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``hold``, ``release``, ``promote`` (``importance``), ``replicate``, ``agent``."""
    hold = sub.add_parser("hold", help="place a named hold: the checkpoint is never deleted")
    release = sub.add_parser("release", help="release a named hold (exit 1 if there is none)")
    imp = sub.add_parser(
        "promote",
        aliases=["demote", "importance"],
        help="change a checkpoint's importance, up or down (aliases: demote, importance)",
    )
    for cmd in (hold, release, imp):
        cmd.add_argument("run", help="the run's name")
        cmd.add_argument("step", type=STEP, help="the checkpoint's step")
    for cmd in (hold, release):
        cmd.add_argument("--name", default="hold", help="hold name (default: hold)")
    imp.add_argument("level", help="transient, routine, milestone, critical (or golden)")
    for cmd in (hold, imp):
        cmd.add_argument("--reason", default="", help="why (recorded with the change)")
    for cmd in (hold, release, imp):
        cmd.add_argument("--json", action="store_true", help="print one JSON object")

    rep = sub.add_parser("replicate", help="one replication pass; exit 1 unless all protected")
    rep.add_argument("run", nargs="?", help="only this run")
    rep.add_argument("--json", action="store_true", help="print one JSON object")

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


# --- hold / release / promote ---------------------------------------------------


def _existing(store: Store, run: str, step: int) -> tuple[Checkpointer, CheckpointInfo]:
    """The checkpointer of ``run`` and the info of ``step``, or a usage error."""
    catalog.validate_run(run)
    catalog.step_dir(step)
    # No background thread: a CLI command must not leave replication running.
    ckpt = Checkpointer(store, run, background=False)
    info = ckpt.info(step, missing_ok=True)
    if info is None:
        raise UnknownCheckpointError(f"no readable checkpoint {run} step {step} in {store.source}")
    return ckpt, info


def _facts_line(info: CheckpointInfo) -> str:
    saved = info.saved_importance
    was = f" (saved as {saved.value})" if saved is not None and saved != info.importance else ""
    holds = ", ".join(info.holds) or "none"
    return f"{info.run} step {info.step}: importance {info.importance.value}{was}; holds: {holds}"


def _facts_json(info: CheckpointInfo, **what: object) -> str:
    """One JSON object: what the command did (``what``), then the checkpoint's facts now."""
    saved = info.saved_importance
    facts = {
        "run": info.run,
        "step": info.step,
        **what,
        "importance": info.importance.value,
        "saved_importance": None if saved is None else saved.value,
        "holds": list(info.holds),
    }
    return json.dumps(facts)


def _hold(store: Store, args: argparse.Namespace, console: Console) -> int:
    ckpt, _ = _existing(store, args.run, args.step)
    info = ckpt.hold(args.step, args.name, reason=args.reason)
    if args.json:
        print(_facts_json(info, hold=args.name, placed=True))
        return EXIT_OK
    console.print(_facts_line(info), highlight=False, soft_wrap=True)
    return EXIT_OK


def _release(store: Store, args: argparse.Namespace, console: Console) -> int:
    ckpt, _ = _existing(store, args.run, args.step)
    released = ckpt.release(args.step, args.name)
    if not released:
        error_console().print(
            f"[red]error:[/red] no hold {escape(repr(args.name))} on {args.run} step {args.step}",
            highlight=False,
        )
    info = ckpt.info(args.step)
    assert info is not None  # info() without missing_ok raises instead
    if args.json:
        print(_facts_json(info, hold=args.name, released=released))
    else:
        console.print(_facts_line(info), highlight=False, soft_wrap=True)
    return EXIT_OK if released else EXIT_NOT_MET


def _importance(store: Store, args: argparse.Namespace, console: Console) -> int:
    level = parse_importance(args.level)  # ValueError (exit 2) names the accepted levels
    ckpt, before = _existing(store, args.run, args.step)
    info = ckpt.set_importance(args.step, level, reason=args.reason)
    if args.json:
        was, changed = before.importance.value, before.importance != level
        print(_facts_json(info, was=was, changed=changed))
        return EXIT_OK
    change = "unchanged" if before.importance == level else f"was {before.importance.value}"
    console.print(f"{_facts_line(info)} ({change})", highlight=False, soft_wrap=True)
    return EXIT_OK


# --- replicate ---------------------------------------------------------------------


def targets_of(store: Store, run: str | None) -> list[tuple[str, int]]:
    """Checkpoints a pass visits, in :meth:`Replicator.run_once` order (newest first per run)."""
    runs = [catalog.validate_run(run)] if run is not None else None
    return Replicator(store, store.policy).targets(runs)


def _unprotected(replicator: Replicator, targets: list[tuple[str, int]]) -> list[str]:
    """Why each checkpoint that is not protected after the pass is not (one line each)."""
    lines = []
    for run, step in targets:
        view = gather(replicator.store, run, step)
        if view is None:
            continue  # deleted meanwhile: nothing left to protect
        status = protection_status(view.facts, replicator.placement(view))
        if status.state != "protected":
            lines.append(f"{run} step {step}: {status.state}: {'; '.join(status.missing)}")
    return lines


def _replicate(store: Store, args: argparse.Namespace, console: Console) -> int:
    """One pass over ``args.run`` (else every run); exit 0 iff every checkpoint is protected."""
    from rich.progress import Progress  # noqa: PLC0415 - only replicate shows progress

    targets = targets_of(store, args.run)
    if args.run is not None and not targets:
        raise UnknownCheckpointError(f"no checkpoints for run {args.run!r} in {store.source}")
    replicator = Replicator(store, store.policy)
    quiet = args.json or not console.is_terminal
    with Progress(console=console, transient=True, disable=quiet) as progress:
        task = progress.add_task("replicating", total=len(targets))

        def advance(run: str, step: int) -> None:
            progress.update(task, description=f"{run} step {step}", advance=1)

        runs = [args.run] if args.run is not None else None
        report = replicator.run_once(runs, on_checkpoint=advance)
    ok = report.protected == report.checked
    why = [] if ok else _unprotected(replicator, targets)
    if args.json:
        print(json.dumps(_report_json(report, ok, why)))
    else:
        _print_report(report, why, console, store)
    return EXIT_OK if ok else EXIT_NOT_MET


def _report_json(report: ReplicationReport, ok: bool, why: list[str]) -> dict[str, object]:
    return {
        "ok": ok,
        "checked": report.checked,
        "protected": report.protected,
        "copied_bytes": report.copied_bytes,
        "copies": [
            {
                "run": c.run,
                "step": c.step,
                "source": c.source,
                "destination": c.destination,
                "nbytes": c.nbytes,
                "seconds": round(c.seconds, 6),
            }
            for c in report.copies
        ],
        "shortfalls": [
            {"run": s.run, "step": s.step, "reason": s.reason} for s in report.shortfalls
        ],
        "unprotected": why,
    }


def _print_report(
    report: ReplicationReport, why: list[str], console: Console, store: Store
) -> None:
    if not report.checked:
        console.print(f"nothing to replicate in {store.source}", highlight=False)
        return
    if report.copies:
        table = Table(title="copies", title_justify="left")
        for column in ("run", "step", "copy", "size", "seconds"):
            table.add_column(
                column, justify="right" if column in ("step", "size", "seconds") else "left"
            )
        for c in report.copies:
            table.add_row(
                c.run,
                str(c.step),
                escape(f"{c.source} -> {c.destination}"),
                human_bytes(c.nbytes),
                f"{c.seconds:.2f}",
            )
        console.print(table)
    if report.shortfalls:
        table = Table(title="shortfalls", title_justify="left")
        for column in ("run", "step", "reason"):
            table.add_column(column, justify="right" if column == "step" else "left")
        for s in report.shortfalls:
            table.add_row(s.run, str(s.step), escape(s.reason))
        console.print(table)
    for line in why:
        console.print(f"[red]not protected:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    summary = (
        f"{report.checked} checked, {report.protected} protected, "
        f"{len(report.copies)} copies ({human_bytes(report.copied_bytes)})"
    )
    ok = report.protected == report.checked
    console.print(f"[green]{summary}[/green]" if ok else f"[red]{summary}[/red]", highlight=False)


# --- agent ---------------------------------------------------------------------------


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


HANDLERS: dict[str, Handler] = {
    "hold": _hold,
    "release": _release,
    "promote": _importance,
    "demote": _importance,
    "importance": _importance,
    "replicate": _replicate,
    "agent": _agent,
}

__all__ = ["HANDLERS", "Handler", "UnknownCheckpointError", "add_parsers", "targets_of"]
