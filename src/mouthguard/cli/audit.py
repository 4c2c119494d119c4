"""``mouthguard audit``: list the audit trail, or verify it.

``audit [RUN [STEP]] [--since T] [--json]`` lists the acts recorded on every
tier's trail (merged: a record on several tiers is shown once), oldest first,
each with its outcome -- or ``no outcome recorded`` where the process died
between the intent and the outcome (or the act is still running). ``--since``
takes an ISO 8601 time (``2026-11-27T10:00``, UTC unless it says otherwise) or
an age (``90s``, ``15m``, ``2h``, ``7d``). ``--json`` prints one object per act:
the export format (``mouthguard audit --json > trail.jsonl``).

``audit --check`` verifies every tier's chain (:mod:`mouthguard.checkpoint.audit_check`)
and signatures (with ``$MOUTHGUARD_MANIFEST_KEY``), names each break by tier and
record number, and prints each trail's head (its last number and digest): keep
that line elsewhere and a later check can prove the tail was not cut.

Exit codes: 0 listed, or the trails are intact; 1 ``--check`` found a break or
a trail that cannot be read; 2 usage errors.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import trail_keys
from mouthguard.checkpoint.audit_check import Act, acts, check_store, merged, read_trails
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, STEP, Handler

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit``."""
    audit = sub.add_parser(
        "audit",
        help="list the audit trail (who did what to which checkpoint), or --check it",
        epilog="exit status: 0 listed or intact; 1 --check found a break; 2 usage error",
    )
    audit.add_argument("run", nargs="?", help="only this run")
    audit.add_argument("step", nargs="?", type=STEP, help="only this step of RUN")
    audit.add_argument(
        "--since", type=_since, default=None, metavar="T", help="ISO time, or an age: 15m, 2h, 7d"
    )
    audit.add_argument(
        "--check", action="store_true", help="verify the chains and signatures; exit 1 on a break"
    )
    audit.add_argument("--json", action="store_true", help="print JSON lines")


def _since(text: str) -> dt.datetime:
    match = _AGE.fullmatch(text.strip())
    if match is not None:
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO time or an age like 15m, 2h, 7d: {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def act_json(act: Act) -> dict[str, object]:
    """One act as the export writes it."""
    r = act.intent.record
    out = act.outcome.record if act.outcome is not None else None
    return {
        "time": r.time,
        "actor": r.actor,
        "act": r.act,
        "run": r.run,
        "step": r.step,
        "tiers": list(r.tiers),
        "reason": r.reason,
        **dict(r.extra),
        "result": None if out is None else out.result,
        "detail": None if out is None else out.detail,
        "finished": None if out is None else out.time,
        "status": act.status,
        "id": r.id,
    }


def run(store: Store, args: argparse.Namespace, console: Console) -> int:
    """List or check the trail (see the module doc)."""
    if args.step is not None and args.run is None:
        raise ValueError("give RUN with STEP")
    if args.run is not None:
        catalog.validate_run(args.run)
    if args.check:
        return _check(store, args, console)
    trails = read_trails(store.tiers)
    found = acts(merged(trails), args.run, args.step, args.since)
    for name, why in trails.unreadable.items():
        console.print(f"[yellow]cannot read the trail on {escape(name)}:[/yellow] {escape(why)}")
    if args.json:
        for act in found:
            print(json.dumps(act_json(act)))
        return EXIT_OK
    if not found:
        console.print("no acts recorded" + (" for that selection" if args.run else ""))
        return EXIT_OK
    table = Table(title="audit trail", title_justify="left")
    for column in ("time", "actor", "act", "run", "step", "tiers", "reason", "outcome"):
        table.add_column(column, justify="right" if column == "step" else "left")
    for act in found:
        r = act.intent.record
        status = act.status
        color = "green" if status in ("done", "not needed") else "red"
        table.add_row(
            r.time[:23].replace("T", " "),
            escape(r.actor),
            r.act,
            escape(r.run),
            "-" if r.step is None else str(r.step),
            escape(", ".join(r.tiers)),
            escape(r.reason),
            f"[{color}]{escape(status)}[/{color}]",
        )
    console.print(table)
    return EXIT_OK


def _check(store: Store, args: argparse.Namespace, console: Console) -> int:
    keys = trail_keys(store.manifest_keys)
    breaks, trails = check_store(store.tiers, keys)
    records = merged(trails)
    open_intents = [a for a in acts(records, args.run, args.step) if a.outcome is None]
    heads = {
        name: (entries[-1].seq, entries[-1].stored.digest if entries[-1].stored else None)
        for name, entries in trails.entries.items()
        if entries
    }
    ok = not breaks and not trails.unreadable
    if args.json:
        body = {
            "ok": ok,
            "signed": keys is not None,
            "breaks": [{"tier": b.tier, "seq": b.seq, "what": b.what} for b in breaks],
            "unreadable": trails.unreadable,
            "records": {name: len(e) for name, e in trails.entries.items()},
            "heads": {n: {"seq": s, "digest": d} for n, (s, d) in heads.items()},
            "no_outcome": [act_json(a) for a in open_intents],
        }
        print(json.dumps(body))
        return EXIT_OK if ok else EXIT_FAILED
    for name, entries in trails.entries.items():
        seq, digest = heads.get(name, (None, None))
        head = "empty" if seq is None else f"head record {seq} digest {digest}"
        console.print(f"{escape(name)}: {len(entries)} record(s); {head}", highlight=False)
    for name, why in trails.unreadable.items():
        console.print(f"[red]cannot read the trail on {escape(name)}:[/red] {escape(why)}")
    for b in breaks:
        where = f"{b.tier}" if b.seq < 0 else f"{b.tier} record {b.seq}"
        console.print(f"[red]break[/red] {escape(where)}: {escape(b.what)}", highlight=False)
    for a in open_intents:
        r = a.intent.record
        console.print(
            f"[yellow]no outcome[/yellow]: {r.act} of {escape(r.run)} step {r.step} by "
            f"{escape(r.actor)} at {r.time} (intent recorded; the act may not have finished)",
            highlight=False,
        )
    signed = "signed and chained" if keys is not None else "chained (unsigned: no manifest key)"
    if ok:
        console.print(f"[green]audit trail intact[/green]: {signed}", highlight=False)
    else:
        console.print(f"[red]audit trail broken[/red]: {len(breaks)} break(s)", highlight=False)
    return EXIT_OK if ok else EXIT_FAILED


HANDLERS: dict[str, Handler] = {"audit": run}

__all__ = ["HANDLERS", "act_json", "add_parser", "run"]
