"""``mouthguard ls`` and ``mouthguard show``: what is committed, and in what state.

Damage is never left out: a checkpoint whose every copy is damaged is listed
with state ``damaged``, one whose manifest no tier can read is listed as an
:class:`~mouthguard.checkpoint.info.UnreadableCheckpoint` (state ``damaged``,
the reason per copy), and a copy a reader found damaged loses its ✓ and shows ✗.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo, UnreadableCheckpoint
from mouthguard.checkpoint.lineage import Link, chain
from mouthguard.checkpoint.peer_memory import node_areas
from mouthguard.checkpoint.store import Store
from mouthguard.cli.common import EXIT_OK, UsageError
from mouthguard.cli.render import human_bytes, human_time
from mouthguard.errors import CorruptCheckpointError

Listed = CheckpointInfo | UnreadableCheckpoint


def runs_of(store: Store, run: str | None) -> list[str]:
    """``[run]`` (validated) or every run on any tier of ``store``."""
    if run is not None:
        catalog.validate_run(run)
        return [run]
    return sorted({r for tier in store.tiers for r in catalog.list_runs(tier)})


def list_run(store: Store, run: str) -> list[Listed]:
    """Every committed checkpoint of ``run``, readable or not, ascending by step."""
    ckpt = Checkpointer(store, run, background=False)
    listed: list[Listed] = []
    for step in ckpt.steps():
        info = ckpt.info(step, missing_ok=True)
        # Only a step no manifest describes is read again, to say why.
        listed.extend([info] if info is not None else ckpt.unreadable([step]))
    return listed


def damaged_checkpoints(store: Store, run: str | None = None) -> list[Listed]:
    """Checkpoints of ``store`` (or of ``run``) whose every copy is damaged."""
    return [
        item
        for name in runs_of(store, run)
        for item in list_run(store, name)
        if item.state == "damaged"
    ]


def ls(store: Store, args: argparse.Namespace, console: Console) -> int:
    """List committed checkpoints per run (``--json``: one JSON line per checkpoint).

    With ``--peers [PATH]`` also the steps held in peer memory, per node and run
    (``--json``: one line per node and step, with ``"kind": "peer-memory"``).
    """
    listed = {run: list_run(store, run) for run in runs_of(store, args.run)}
    held = peer_holdings(args.peers, args.run) if getattr(args, "peers", None) else []
    if args.run is not None and not listed[args.run] and not held:
        raise UsageError(f"no checkpoints for run {args.run!r} in {store.source}")
    if args.json:
        for items in listed.values():
            for item in items:
                print(json.dumps(item.to_json()))
        for row in held:
            print(json.dumps({"kind": "peer-memory", **row}))
        return EXIT_OK
    if held:
        console.print(peer_table(args.peers, held))
    if not any(listed.values()):
        console.print(f"no checkpoints in {store.source}", highlight=False)
        return EXIT_OK
    for run, items in listed.items():
        if items:
            console.print(run_table(run, items))
    _print_notes(listed, console)
    return EXIT_OK


def _print_notes(listed: dict[str, list[Listed]], console: Console) -> None:
    """Below the tables: why each damaged checkpoint is damaged, each suspect one suspect."""
    damaged = [item for items in listed.values() for item in items if item.state == "damaged"]
    for item in damaged:
        why = "; ".join(f"{c.tier}: {c.damage}" for c in item.copies if c.damage)
        console.print(
            f"[red]damaged:[/red] {escape(item_name(item))} -- {escape(why)}",
            highlight=False,
            soft_wrap=True,
        )
    for items in listed.values():
        for item in items:
            if isinstance(item, CheckpointInfo) and item.suspect:
                console.print(
                    f"[yellow]suspect:[/yellow] {escape(item_name(item))} -- "
                    f"{escape(item.suspect)} (a resume skips it)",
                    highlight=False,
                    soft_wrap=True,
                )


def peer_holdings(path: str, run: str | None) -> list[dict[str, object]]:
    """Every complete step held in the node areas under ``path`` (of ``run``, or all)."""
    rows: list[dict[str, object]] = []
    for area in node_areas(path):
        for name in [run] if run is not None else area.runs():
            rows.extend(
                {
                    "node": area.domain,
                    "run": name,
                    "step": held.step,
                    "ranks": list(held.ranks),
                    "bytes": held.nbytes,
                }
                for held in area.held(name)
            )
    return rows


def peer_table(path: str, rows: list[dict[str, object]]) -> Table:
    """Peer memory: per node, run and step, whose rank files it holds and their bytes."""
    total = sum(int(str(r["bytes"])) for r in rows)
    table = Table(
        title=f"peer memory {escape(path)} ({human_bytes(total)} held)", title_justify="left"
    )
    for column in ("node", "run", "step", "ranks", "size"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for r in rows:
        ranks = ",".join(str(x) for x in r["ranks"])  # type: ignore[attr-defined]
        table.add_row(
            escape(str(r["node"])),
            escape(str(r["run"])),
            str(r["step"]),
            ranks,
            human_bytes(int(str(r["bytes"]))),
        )
    return table


def item_name(item: Listed) -> str:
    """``run step N``."""
    return f"{item.run} step {item.step}"


def _copy_cell(copy: CopyInfo) -> str:
    mark = "✗" if copy.damage else ("✓" if copy.verified else "")
    return f"{copy.tier}{mark}"


def run_table(run: str, items: list[Listed]) -> Table:
    """One run's checkpoints: step, importance, state, size, created, copies (and holds)."""
    # Per-file detail lives in `show`; the holds column appears only when some
    # checkpoint of the run has a hold. ✓ verified, ✗ damaged.
    with_holds = any(isinstance(i, CheckpointInfo) and i.holds for i in items)
    columns = ["step", "importance", "state", "size", "created", "copies"]
    table = Table(title=f"run {escape(run)}", title_justify="left")
    for column in [*columns, "holds"] if with_holds else columns:
        wrap = column in ("copies", "holds")
        table.add_column(
            column,
            justify="right" if column in ("step", "size") else "left",
            no_wrap=not wrap,
            min_width=8 if wrap else None,
        )
    for item in items:
        copies = " ".join(_copy_cell(c) for c in item.copies)
        state = f"[red]{item.state}[/red]" if item.state == "damaged" else item.state
        if isinstance(item, UnreadableCheckpoint):
            row = [str(item.step), "?", state, "?", "?", escape(copies)]
            if with_holds:
                row.append("")
        else:
            if item.suspect:  # intact bytes, a state a check refused; why: below the table
                state = f"{state} [yellow]suspect[/yellow]"
            elif item.checked:
                state = f"{state}, checked"
            row = [
                str(item.step),
                item.importance.value,
                state,
                human_bytes(item.nbytes),
                item.created.astimezone().strftime("%m-%d %H:%M"),
                escape(copies),
            ]
            if with_holds:
                row.append(escape(", ".join(item.holds)))
        table.add_row(*row)
    return table


def show(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Show one checkpoint; exit 1 when it is damaged beyond reading."""
    catalog.validate_run(args.run)
    catalog.validate_step(args.step)
    ckpt = Checkpointer(store, args.run, background=False)
    info = ckpt.info(args.step, missing_ok=True)
    if info is None:
        unreadable = [u for u in ckpt.unreadable() if u.step == args.step]
        if unreadable:
            raise CorruptCheckpointError(
                f"{args.run} step {args.step} is committed but its manifest cannot be read "
                f"on any tier: {unreadable[0].reason}"
            )
        raise UsageError(f"no committed checkpoint {args.run} step {args.step} in {store.source}")
    links = chain(store, args.run, args.step)
    if args.json:
        print(json.dumps({**info.to_json(), "lineage": [_link_json(x) for x in links]}, indent=2))
        return EXIT_OK
    table = Table(title=f"{info.run} step {info.step}", show_header=False, title_justify="left")
    table.add_column("field")
    table.add_column("value")
    table.add_row("importance", info.importance.value)
    if info.saved_importance is not None and info.saved_importance != info.importance:
        table.add_row("saved importance", info.saved_importance.value)
    table.add_row("state", "[red]damaged[/red]" if info.state == "damaged" else info.state)
    if info.suspect:
        table.add_row("suspect", f"[yellow]{escape(info.suspect)}[/yellow] (a resume skips it)")
    elif info.checked:
        table.add_row("check", "its state passed a check on resume")
    for missing in info.protection:
        table.add_row("missing for protection", escape(missing))
    table.add_row("holds", escape(", ".join(info.holds)) or "none")
    table.add_row("created", human_time(info.created))
    table.add_row("size", f"{human_bytes(info.nbytes)} ({info.nbytes} bytes)")
    table.add_row("tensor bytes", str(info.tensor_bytes))
    table.add_row("world size", str(info.world_size))
    for f in info.files:
        table.add_row(escape(f.name), f"{human_bytes(f.size)}  {f.checksum}")
    for c in info.copies:
        if c.damage:
            status = f"[red]DAMAGED[/red]: {escape(c.damage)}"
        elif c.verified_at:
            status = f"verified {human_time(c.verified_at)}"
        else:
            status = "not verified"
        table.add_row(f"copy on {escape(c.tier)}", f"{escape(c.location)}  ({status})")
    console.print(table)
    _print_chain(links, console)
    return EXIT_OK


#: Links of a lineage chain ``show`` prints before eliding the middle (it keeps the oldest).
_CHAIN_SHOWN = 40


def _link_json(link: Link) -> dict[str, object]:
    lineage = link.lineage
    return {
        "run": link.origin.run,
        "step": link.origin.step,
        "created": link.origin.created,
        "missing": link.missing or None,
        **({} if lineage is None else lineage.to_json()),
    }


def _link_text(link: Link) -> str:
    where = f"{link.origin.run} step {link.origin.step}"
    if link.lineage is None:
        return f"{where}: {link.missing}"
    parts = []
    resumed, data = link.lineage.resumed_from, link.lineage.dataset
    if resumed is not None:
        parts.append(f"resumed from {resumed.run} step {resumed.step}")
    if data is not None:
        parts.append(
            f"data {data.fingerprint[:24]} epoch {data.epoch} position {data.consumed}"
            + (f" (state[{data.key!r}])" if data.key else "")
        )
    if link.lineage.parent is None:
        parts.append("first checkpoint (no parent recorded)")
    return f"{where}: " + "; ".join(parts) if parts else where


def _print_chain(links: list[Link], console: Console) -> None:
    """The lineage, newest first, back to the first checkpoint."""
    console.print("lineage (newest first):", highlight=False)
    shown = links
    if len(links) > _CHAIN_SHOWN:
        shown = [*links[: _CHAIN_SHOWN - 1], links[-1]]
    for i, link in enumerate(shown):
        if i == _CHAIN_SHOWN - 1 and len(links) > _CHAIN_SHOWN:
            console.print(f"  ... {len(links) - _CHAIN_SHOWN} more", highlight=False)
        arrow = "  " if i == 0 else "  <- "
        console.print(f"{arrow}{escape(_link_text(link))}", highlight=False, soft_wrap=True)
