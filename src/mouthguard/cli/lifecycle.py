"""``mouthguard gc``: retention on demand (``scrub`` is in ``main``, ``restore`` apart).

``gc`` is retention. Without ``--apply`` it is a dry run: one row per checkpoint
(KEEP or DELETE, with every reason the policy gave) and the copy actions
(trash, purge, demote, restore from trash) that *would* be carried out.
``--apply`` carries them out and also removes interrupted saves older than
``--grace-seconds``. Exit 0 (a failed action is reported, not fatal: the next
pass retries it).

The blast-radius limit (:mod:`mouthguard.policy.blast_radius`): a run whose pass
would start deleting more than ``--max-delete-share`` of its checkpoints
(default ``policy.max_delete_share``, 0.5) or any milestone has none of its
deletions carried out; the command names what it would have deleted and why it
stopped, carries out everything else, and exits 3 (``EXIT_REFUSED``). A dry run
shows the same refusal and exits 0. ``--force`` lifts the limit.

``restore`` is in :mod:`mouthguard.cli.restore`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import DEFAULT_GRACE_SECONDS, Checkpointer
from mouthguard.checkpoint.gathering import gather, runs_of, steps_of
from mouthguard.checkpoint.info import UnreadableCheckpoint
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    NON_NEGATIVE,
    Handler,
)
from mouthguard.cli.listing import list_run
from mouthguard.cli.render import human_bytes, progress
from mouthguard.jobs.retention import AppliedAction, RetentionReport, apply_retention
from mouthguard.policy.blast_radius import Refusal
from mouthguard.policy.config import check_max_share


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``gc``."""
    gc = sub.add_parser(
        "gc", help="retention: show what to keep and delete (dry run); --apply carries it out"
    )
    gc.add_argument("run", nargs="?", help="only this run")
    gc.add_argument(
        "--apply", action="store_true", help="carry out the actions, remove interrupted saves"
    )
    gc.add_argument(
        "--grace-seconds",
        type=NON_NEGATIVE,
        default=DEFAULT_GRACE_SECONDS,
        help="interrupted saves younger than this are left alone (a save may be in flight)",
    )
    gc.add_argument(
        "--max-delete-share",
        type=_share,
        default=None,
        metavar="SHARE",
        help="refuse to start deleting more than this share of a run's checkpoints in one "
        "pass (default: policy.max_delete_share, 0.5)",
    )
    gc.add_argument(
        "--force",
        action="store_true",
        help="lift the blast-radius limit: delete whatever the policy says, milestones included",
    )
    gc.add_argument(
        "--actor",
        default=None,
        help="who acts, for the audit trail (default: $MOUTHGUARD_ACTOR, else user@host)",
    )
    gc.add_argument("--json", action="store_true", help="print JSON lines")


def _share(text: str) -> float:
    try:
        return check_max_share(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1]: {text!r}") from None


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
        report = apply_retention(
            store,
            dry_run=not args.apply,
            runs=runs,
            force=args.force,
            max_delete_share=args.max_delete_share,
            actor=args.actor,
        )
        bar.update(task, description="removing interrupted saves", total=len(runs), completed=0)
        for run in runs:
            if args.apply:
                ckpt = Checkpointer(store, run, background=False)
                garbage.extend(ckpt.collect_garbage(grace_seconds=args.grace_seconds))
            else:
                garbage.extend(_partial_saves(store, run, args.grace_seconds))
            bar.advance(task)
    # Retention never deletes what no tier holds intact; say so, so it is not forgotten.
    lost = [i for run in runs for i in list_run(store, run) if i.state == "damaged"]
    if args.json:
        for item in lost:
            line = {"kind": "damaged_checkpoint", "run": item.run, "step": item.step}
            print(json.dumps({**line, "copies": [c.to_json() for c in item.copies]}))
        _gc_json(report, before, garbage)
        for refusal in report.refused:
            print(json.dumps(_refusal_json(refusal, report.dry_run)))
    else:
        _gc_tables(report, before, garbage, console)
        for item in lost:
            why = "; ".join(f"{c.tier}: {c.damage}" for c in item.copies if c.damage)
            unjudged = (
                "; retention cannot judge it without a manifest: never deleted automatically"
                if isinstance(item, UnreadableCheckpoint)
                else ""
            )
            console.print(
                f"[red]damaged on every tier[/red]: {escape(item.run)} step {item.step} -- "
                f"{escape(why)}; no intact copy is left to load or repair from{unjudged}",
                highlight=False,
                soft_wrap=True,
            )
        for refusal in report.refused:
            _print_refusal(refusal, report.dry_run, console)
    return EXIT_REFUSED if report.refused and not report.dry_run else EXIT_OK


def _refusal_json(refusal: Refusal, dry_run: bool) -> dict[str, object]:
    return {
        "kind": "refused",
        "run": refusal.run,
        "dry_run": dry_run,
        "why": refusal.why,
        "checkpoints": refusal.checkpoints,
        "would_delete": [
            {"step": d.step, "importance": d.importance.value, "reason": d.reason}
            for d in refusal.would_delete
        ],
    }


def _print_refusal(refusal: Refusal, dry_run: bool, console: Console) -> None:
    verb = "--apply would refuse" if dry_run else "refused"
    console.print(
        f"[red]{verb}[/red] the deletions in run {escape(refusal.run)}: "
        f"{escape(refusal.why)}. Nothing of this run was trashed or purged; "
        "it would have deleted:",
        highlight=False,
        soft_wrap=True,
    )
    for d in refusal.would_delete:
        console.print(
            f"  step {d.step} ({d.importance.value}): {escape(d.reason)}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        "Check the policy; rerun with --force (or a larger --max-delete-share) if this is meant.",
        highlight=False,
    )


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


HANDLERS: dict[str, Handler] = {"gc": _gc}

__all__ = ["HANDLERS", "add_parsers"]
