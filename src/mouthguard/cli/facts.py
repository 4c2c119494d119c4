"""``mouthguard hold|release|promote``: change a checkpoint's mutable facts (holds, importance).

``demote`` and ``importance`` (the command's earlier name) are aliases of
``promote``: each sets any level, up or down. The facts are sidecars next to
each copy (the manifest never changes); the output is the checkpoint's facts
after the change, or with ``--json`` one JSON object saying what happened.

Exit codes (:mod:`mouthguard.cli.common`): 0 success; 1 ``release`` found no
such hold; 2 usage errors, including a run or step that names no readable
checkpoint (:class:`~mouthguard.cli.common.UsageError`).
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import CheckpointInfo
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, STEP, Handler, UsageError, print_error
from mouthguard.policy.importance import parse_importance


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``hold``, ``release`` and ``promote`` (aliases ``demote``, ``importance``)."""
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
    for cmd in (hold, release, imp):
        cmd.add_argument("--reason", default="", help="why (recorded with the change)")
        cmd.add_argument(
            "--actor",
            default=None,
            help="who acts, for the audit trail (default: $MOUTHGUARD_ACTOR, else user@host)",
        )
        cmd.add_argument("--json", action="store_true", help="print one JSON object")


def _existing(store: Store, run: str, step: int) -> tuple[Checkpointer, CheckpointInfo]:
    """The checkpointer of ``run`` and the info of ``step``, or a usage error."""
    catalog.validate_run(run)
    catalog.validate_step(step)
    # No background thread: a CLI command must not leave replication running.
    ckpt = Checkpointer(store, run, background=False)
    info = ckpt.info(step, missing_ok=True)
    if info is None:
        raise UsageError(f"no readable checkpoint {run} step {step} in {store.source}")
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
    info = ckpt.hold(args.step, args.name, reason=args.reason, actor=args.actor)
    if args.json:
        print(_facts_json(info, hold=args.name, placed=True))
        return EXIT_OK
    console.print(_facts_line(info), highlight=False, soft_wrap=True)
    return EXIT_OK


def _release(store: Store, args: argparse.Namespace, console: Console) -> int:
    ckpt, _ = _existing(store, args.run, args.step)
    released = ckpt.release(args.step, args.name, reason=args.reason, actor=args.actor)
    if not released:
        print_error(f"no hold {args.name!r} on {args.run} step {args.step}")
    info = ckpt.info(args.step)
    assert info is not None  # info() without missing_ok raises instead
    if args.json:
        print(_facts_json(info, hold=args.name, released=released))
    else:
        console.print(_facts_line(info), highlight=False, soft_wrap=True)
    return EXIT_OK if released else EXIT_FAILED


def _importance(store: Store, args: argparse.Namespace, console: Console) -> int:
    level = parse_importance(args.level)  # ValueError (exit 2) names the accepted levels
    ckpt, before = _existing(store, args.run, args.step)
    info = ckpt.set_importance(args.step, level, reason=args.reason, actor=args.actor)
    if args.json:
        was, changed = before.importance.value, before.importance != level
        print(_facts_json(info, was=was, changed=changed))
        return EXIT_OK
    change = "unchanged" if before.importance == level else f"was {before.importance.value}"
    console.print(f"{_facts_line(info)} ({change})", highlight=False, soft_wrap=True)
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "hold": _hold,
    "release": _release,
    "promote": _importance,
    "demote": _importance,
    "importance": _importance,
}

__all__ = ["HANDLERS", "add_parsers"]
