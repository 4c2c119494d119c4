"""``mouthguard gc|restore``: retention and repair on demand (``scrub`` is in ``main``).

``gc`` is retention. Without ``--apply`` it is a dry run: one row per checkpoint
(KEEP or DELETE, with every reason the policy gave) and the copy actions
(trash, purge, demote, restore from trash) that *would* be carried out.
``--apply`` carries them out and also removes interrupted saves older than
``--grace-seconds``. Exit 0 (a failed action is reported, not fatal: the next
pass retries it).

``restore RUN STEP --to TIER`` makes a verified copy on TIER from an intact copy
on another tier (exit 0, also when TIER already holds a valid copy; 1 when no
intact source exists; 2 for an unknown tier, run or step).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import DEFAULT_GRACE_SECONDS, Checkpointer
from mouthguard.checkpoint.facts import gather, runs_of, steps_of
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import CopyTarget, verify_target
from mouthguard.cli.ops import EXIT_NOT_MET, EXIT_OK, Handler, UnknownCheckpointError
from mouthguard.cli.render import human_bytes
from mouthguard.errors import CheckpointExistsError, MouthguardError
from mouthguard.jobs.copy import CopyResult, copy_checkpoint
from mouthguard.jobs.retention import AppliedAction, RetentionReport, apply_retention
from mouthguard.tiers.base import Tier


def non_negative_float(text: str) -> float:
    """Argparse type: a float >= 0 (argparse turns the ValueError into exit 2)."""
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise ValueError(text)
    return value


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``gc`` and ``restore``."""
    gc = sub.add_parser(
        "gc", help="retention: show what to keep and delete (dry run); --apply carries it out"
    )
    gc.add_argument("run", nargs="?", help="only this run")
    gc.add_argument(
        "--apply", action="store_true", help="carry out the actions, remove interrupted saves"
    )
    gc.add_argument(
        "--grace-seconds",
        type=non_negative_float,
        default=DEFAULT_GRACE_SECONDS,
        help="interrupted saves younger than this are left alone (a save may be in flight)",
    )
    gc.add_argument("--json", action="store_true", help="print JSON lines")

    restore = sub.add_parser("restore", help="make a verified copy on a tier from an intact one")
    restore.add_argument("run")
    restore.add_argument("step", type=int)
    restore.add_argument("--to", required=True, metavar="TIER", help="the tier to copy to")


@contextmanager
def progress(console: Console, *, show: bool) -> Iterator[Progress]:
    """A transient rich progress display, shown only on a terminal."""
    with Progress(console=console, transient=True, disable=not show) as progress:
        yield progress


# --- gc ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Before:
    """What retention is about to judge: each checkpoint's importance, trashed copies."""

    importance: dict[tuple[str, int], str]
    trashed: set[tuple[str, int, str]]


def _before(store: Store, runs: list[str]) -> _Before:
    importance: dict[tuple[str, int], str] = {}
    trashed: set[tuple[str, int, str]] = set()
    for run in runs:
        for step in steps_of(store, run):
            view = gather(store, run, step)
            if view is None:
                continue
            importance[(run, step)] = view.facts.importance.value
            trashed.update((run, step, c.tier) for c in view.facts.copies if c.trashed)
    return _Before(importance, trashed)


def _kind(applied: AppliedAction, before: _Before) -> str:
    """The action as an operator sees it: a ``keep`` that lifts a trash mark is ``restore``."""
    kind = applied.action.action
    if kind == "keep" and (applied.run, applied.step, applied.action.tier) in before.trashed:
        return "restore"
    return kind


def _status(applied: AppliedAction, kind: str, before: _Before, dry_run: bool) -> str:
    if applied.error is not None:
        return f"failed: {applied.error}"
    if kind == "trash" and (applied.run, applied.step, applied.action.tier) in before.trashed:
        return "in trash"
    if dry_run:
        return "would do"
    return "done" if applied.done else "not needed"


def _gc(store: Store, args: argparse.Namespace, console: Console) -> int:
    runs = [catalog.validate_run(args.run)] if args.run is not None else runs_of(store)
    before = _before(store, runs)
    garbage: list[catalog.GarbageReport] = []
    with progress(console, show=args.apply and not args.json and console.is_terminal) as bar:
        task = bar.add_task("applying retention", total=None)
        report = apply_retention(store, dry_run=not args.apply, runs=runs)
        bar.update(task, description="removing interrupted saves", total=len(runs), completed=0)
        for run in runs:
            if args.apply:
                ckpt = Checkpointer(store, run, background=False)
                garbage.extend(ckpt.collect_garbage(grace_seconds=args.grace_seconds))
            else:
                garbage.extend(_partial_saves(store, run, args.grace_seconds))
            bar.advance(task)
    if args.json:
        _gc_json(report, before, garbage)
    else:
        _gc_tables(report, before, garbage, console)
    return EXIT_OK


def _partial_saves(store: Store, run: str, grace: float) -> list[catalog.GarbageReport]:
    """What ``--apply`` would remove (incomplete tier objects cannot be counted ahead)."""
    found = []
    for tier in store.tiers:
        debris = [*catalog.partial_saves(tier, run), *catalog.uncommitted_steps(tier, run)]
        found.append(
            catalog.GarbageReport(tier.name, [p for p in debris if p.age_seconds >= grace], 0)
        )
    return found


def _verdict(report: RetentionReport, run: str, step: int, keep: bool) -> str:
    deleting = any(
        a.run == run and a.step == step and a.action.action in ("trash", "purge")
        for a in report.actions
    )
    return "DELETE" if deleting or not keep else "KEEP"


def _shown(report: RetentionReport, before: _Before) -> list[tuple[AppliedAction, str]]:
    """The actions worth showing: everything but a plain keep."""
    kinds = [(a, _kind(a, before)) for a in report.actions]
    return [(a, k) for a, k in kinds if k != "keep"]


def _gc_json(
    report: RetentionReport, before: _Before, garbage: list[catalog.GarbageReport]
) -> None:
    dry = report.dry_run
    for d in report.decisions:
        line = {
            "kind": "checkpoint",
            "run": d.run,
            "step": d.step,
            "importance": before.importance.get(d.key),
            "verdict": _verdict(report, d.run, d.step, d.keep).lower(),
            "reasons": list(d.reasons),
        }
        print(json.dumps(line))
    for a, kind in _shown(report, before):
        status = _status(a, kind, before, dry)
        line = {
            "kind": "action",
            "run": a.run,
            "step": a.step,
            "tier": a.action.tier,
            "action": kind,
            "reason": a.action.reason,
            "done": a.done,
            "status": status,
            "error": a.error,
        }
        print(json.dumps(line))
    for g in garbage:
        for p in g.partial_saves:
            line = {
                "kind": "interrupted_save",
                "tier": g.tier,
                "run": p.run,
                "step": p.step,
                "prefix": p.prefix,
                "nbytes": p.nbytes,
                "age_seconds": round(p.age_seconds, 3),
                "removed": not dry,
            }
            print(json.dumps(line))
    print(json.dumps({"kind": "summary", **_summary(report, before, garbage)}))


def _summary(
    report: RetentionReport, before: _Before, garbage: list[catalog.GarbageReport]
) -> dict[str, object]:
    kinds = [k for a, k in _shown(report, before) if report.dry_run or a.done]
    verdicts = [_verdict(report, d.run, d.step, d.keep) for d in report.decisions]
    return {
        "dry_run": report.dry_run,
        "checkpoints": len(report.decisions),
        "keep": verdicts.count("KEEP"),
        "delete": verdicts.count("DELETE"),
        **{k: kinds.count(k) for k in ("trash", "purge", "demote", "restore")},
        "failed": sum(a.error is not None for a in report.actions),
        "interrupted_saves": sum(len(g.partial_saves) for g in garbage),
        "incomplete_files": sum(g.incomplete_objects for g in garbage),
    }


def _gc_tables(
    report: RetentionReport,
    before: _Before,
    garbage: list[catalog.GarbageReport],
    console: Console,
) -> None:
    dry = report.dry_run
    title = "retention (dry run: nothing changed)" if dry else "retention (applied)"
    if report.decisions:
        table = Table(title=title, title_justify="left")
        for column in ("run", "step", "importance", "verdict", "reasons"):
            table.add_column(column, justify="right" if column == "step" else "left")
        for d in report.decisions:
            verdict = _verdict(report, d.run, d.step, d.keep)
            color = "green" if verdict == "KEEP" else "red"
            table.add_row(
                escape(d.run),
                str(d.step),
                before.importance.get(d.key, "?"),
                f"[{color}]{verdict}[/{color}]",
                escape("; ".join(d.reasons)),
            )
        console.print(table)
    else:
        console.print("no checkpoints to judge", highlight=False)
    shown = _shown(report, before)
    if shown:
        table = Table(title="copy actions", title_justify="left")
        for column in ("run", "step", "tier", "action", "status", "reason"):
            table.add_column(column, justify="right" if column == "step" else "left")
        for a, kind in shown:
            status = _status(a, kind, before, dry)
            table.add_row(
                escape(a.run),
                str(a.step),
                escape(a.action.tier),
                kind,
                escape(status),
                escape(a.action.reason),
            )
        console.print(table)
    for g in garbage:
        for p in g.partial_saves:
            verb = "would remove" if dry else "removed"
            console.print(
                f"{verb} interrupted save {escape(g.tier)}:{escape(p.prefix)} "
                f"({human_bytes(p.nbytes)}, {p.age_seconds:.0f} s old)",
                highlight=False,
            )
    s = _summary(report, before, garbage)
    actions = ", ".join(f"{s[k]} {k}" for k in ("trash", "purge", "demote", "restore"))
    if dry:
        console.print(
            f"dry run: {s['keep']} keep, {s['delete']} delete; would {actions}; "
            f"{s['interrupted_saves']} interrupted save(s) to remove. "
            "Run with --apply to carry this out.",
            highlight=False,
        )
        return
    console.print(
        f"applied: {s['keep']} keep, {s['delete']} delete; {actions} done"
        + (f"; [red]{s['failed']} failed[/red]" if s["failed"] else ""),
        highlight=False,
    )
    console.print(
        f"{s['interrupted_saves']} interrupted save(s) and "
        f"{s['incomplete_files']} incomplete file(s) removed",
        highlight=False,
    )


# --- restore -------------------------------------------------------------------------


def _tier(store: Store, name: str) -> Tier:
    try:
        return store.tier(name)
    except KeyError:
        names = ", ".join(t.name for t in store.tiers)
        msg = f"no tier {name!r} in {store.source} (tiers: {names})"
        raise UnknownCheckpointError(msg) from None


def _restore(store: Store, args: argparse.Namespace, console: Console) -> int:
    run, step = catalog.validate_run(args.run), args.step
    catalog.step_dir(step)
    dst = _tier(store, args.to)
    view = gather(store, run, step)
    if view is None:
        raise UnknownCheckpointError(f"no readable checkpoint {run} step {step} in {store.source}")
    what = f"{run} step {step}"
    if dst.exists(catalog.manifest_key(run, step)):
        check = verify_target(CopyTarget(run, step, dst))
        if check.ok:
            console.print(
                f"{what}: {dst.name} already holds a valid copy (verified now); nothing to do",
                highlight=False,
            )
            return EXIT_OK
        console.print(
            f"{what}: the copy on {dst.name} is damaged ({escape(check.reason)}); replacing it",
            highlight=False,
        )
    verified = {c.tier for c in view.facts.copies if c.verified}
    sources = sorted(
        (t for t in view.readable if t is not dst), key=lambda t: t.name not in verified
    )
    failures = [f"copy on {t.name} is unreadable: {reason}" for t, reason in view.damaged]
    result: CopyResult | None = None
    with progress(console, show=console.is_terminal) as bar:
        task = bar.add_task("restoring", total=None)
        for src in sources:
            bar.update(task, description=f"copying {what} {src.name} -> {dst.name}")
            try:
                result = copy_checkpoint(src, dst, run, step)
                break
            except CheckpointExistsError:
                console.print(f"{what}: {dst.name} already holds a valid copy", highlight=False)
                return EXIT_OK
            except MouthguardError as exc:
                failures.append(f"from {src.name}: {exc}")
    if result is None:
        if not sources and not failures:
            failures.append(f"no copy on any tier other than {dst.name}")
        err = Console(stderr=True)
        err.print(
            f"[red]error:[/red] cannot restore {what} to {escape(dst.name)}: no intact source",
            highlight=False,
        )
        for line in failures:
            err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        return EXIT_NOT_MET
    console.print(
        f"restored {what} to {dst.name} from {result.source}: {human_bytes(result.nbytes)} "
        f"in {result.seconds:.2f} s, verified by read-back",
        highlight=False,
    )
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"gc": _gc, "restore": _restore}

__all__ = ["HANDLERS", "add_parsers", "non_negative_float", "progress"]
