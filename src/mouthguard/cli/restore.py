"""``mouthguard restore``: a verified copy on a tier, made from an intact copy on another.

``restore RUN STEP --to TIER`` makes a verified copy on TIER from an intact copy
on another tier (exit 0, also when TIER already holds a valid copy; 1 when no
intact source exists; 2 for an unknown tier, run or step). With ``--json`` it
prints one object: ``outcome`` is ``restored``, ``already_valid`` or
``no_intact_source``, with the source, bytes and seconds of the copy made and
the reasons every source failed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.gathering import gather
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, STEP, Handler, UsageError, print_error
from mouthguard.cli.render import error_console, human_bytes, progress
from mouthguard.errors import CheckpointExistsError, MouthguardError
from mouthguard.jobs.copy import CopyResult, copy_checkpoint
from mouthguard.tiers.base import Tier


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``restore``."""
    restore = sub.add_parser("restore", help="make a verified copy on a tier from an intact one")
    restore.add_argument("run", help="the run's name")
    restore.add_argument("step", type=STEP, help="the checkpoint's step")
    restore.add_argument("--to", required=True, metavar="TIER", help="the tier to copy to")
    restore.add_argument(
        "--actor",
        default=None,
        help="who acts, for the audit trail (default: $MOUTHGUARD_ACTOR, else user@host)",
    )
    restore.add_argument("--json", action="store_true", help="print one JSON object")


def _tier(store: Store, name: str) -> Tier:
    try:
        return store.tier(name)
    except KeyError:
        names = ", ".join(t.name for t in store.tiers)
        msg = f"no tier {name!r} in {store.source} (tiers: {names})"
        raise UsageError(msg) from None


@dataclass
class _Restore:
    """What ``restore`` did: ``outcome`` is restored, already_valid or no_intact_source."""

    outcome: str
    result: CopyResult | None = None
    replaced: str | None = None  # why the copy already on the target was damaged
    failures: list[str] = field(default_factory=list)


def _restore(store: Store, args: argparse.Namespace, console: Console) -> int:
    run, step = catalog.validate_run(args.run), args.step
    catalog.validate_step(step)
    dst = _tier(store, args.to)
    view = gather(store, run, step)
    if view is None:
        raise UsageError(f"no readable checkpoint {run} step {step} in {store.source}")
    done = _Restore("no_intact_source")
    if dst.exists(catalog.manifest_key(run, step)):
        check = verify_and_record(CopyRef(dst, run, step))
        if check.ok:
            return _report_restore(args, dst, _Restore("already_valid"), console, verified=True)
        done.replaced = check.reason
    verified = {c.tier for c in view.facts.copies if c.verified}
    sources = sorted(
        (t for t in view.readable if t is not dst), key=lambda t: t.name not in verified
    )
    done.failures = [f"copy on {t.name} is unreadable: {reason}" for t, reason in view.damaged]
    with progress(console, show=console.is_terminal and not args.json) as bar:
        task = bar.add_task("restoring", total=None)
        for src in sources:
            bar.update(task, description=f"copying {run} step {step} {src.name} -> {dst.name}")
            try:
                done.result = copy_checkpoint(
                    src, dst, run, step, reason=f"restore to {dst.name}", actor=args.actor
                )
                done.outcome = "restored"
                break
            except CheckpointExistsError:
                done.outcome = "already_valid"
                break
            except MouthguardError as exc:
                done.failures.append(f"from {src.name}: {exc}")
    if done.outcome == "no_intact_source" and not sources and not done.failures:
        done.failures.append(f"no copy on any tier other than {dst.name}")
    return _report_restore(args, dst, done, console)


def _report_restore(
    args: argparse.Namespace, dst: Tier, done: _Restore, console: Console, *, verified: bool = False
) -> int:
    """Print what ``restore`` did (text, or one JSON object); its exit code."""
    ok = done.outcome != "no_intact_source"
    what = f"{args.run} step {args.step}"
    if done.replaced is not None and not args.json:
        console.print(
            f"{what}: the copy on {dst.name} is damaged ({escape(done.replaced)})",
            highlight=False,
        )
    if done.outcome == "no_intact_source":
        print_error(f"cannot restore {what} to {dst.name}: no intact source")
        err = error_console()
        for line in done.failures:
            err.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    if args.json:
        result = done.result
        body = {"run": args.run, "step": args.step, "to": dst.name, "ok": ok}
        print(
            json.dumps(
                {
                    **body,
                    "outcome": done.outcome,
                    "source": None if result is None else result.source,
                    "nbytes": None if result is None else result.nbytes,
                    "seconds": None if result is None else round(result.seconds, 6),
                    "damaged_copy_on_target": done.replaced,
                    "failures": done.failures,
                }
            )
        )
        return EXIT_OK if ok else EXIT_FAILED
    if done.outcome == "already_valid":
        now = " (verified now); nothing to do" if verified else ""
        console.print(f"{what}: {dst.name} already holds a valid copy{now}", highlight=False)
    elif done.result is not None:
        r = done.result
        console.print(
            f"restored {what} to {dst.name} from {r.source}: {human_bytes(r.nbytes)} "
            f"in {r.seconds:.2f} s, verified by read-back",
            highlight=False,
        )
    return EXIT_OK if ok else EXIT_FAILED


HANDLERS: dict[str, Handler] = {"restore": _restore}

__all__ = ["HANDLERS", "add_parsers"]
