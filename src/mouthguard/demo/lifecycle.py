"""The end of the demo: importance at work on the run's final checkpoints.

After the comparison, the parent process looks at what the run left behind:
each checkpoint's importance and the state it reached (``protected``: the
placement its importance asks for is met), then asks retention what it *would*
do, exactly as ``mouthguard gc RUN`` does without ``--apply``:
:func:`~mouthguard.jobs.retention.apply_retention` with ``dry_run=True``. Which
checkpoints it keeps and why (critical: never auto-deleted; every milestone;
the last routine ones; the newest valid checkpoint), and what would happen to
each copy on each tier. The run is listed again afterwards, to show that the
dry run deleted and trashed nothing. :func:`render_lifecycle` turns the result
into what ``mouthguard demo`` shows (a rich renderable: nothing here prints).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.store import Store
from mouthguard.jobs.retention import apply_retention
from mouthguard.policy.config import LevelPolicy
from mouthguard.policy.facts import format_duration
from mouthguard.policy.importance import Importance

__all__ = ["CheckpointState", "GcDecision", "Lifecycle", "inspect_lifecycle", "render_lifecycle"]


@dataclass(frozen=True)
class CheckpointState:
    """One final checkpoint: its (effective) importance and how far it is protected."""

    step: int
    importance: str
    state: str
    copies: tuple[str, ...]
    trashed: tuple[str, ...] = ()
    holds: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcDecision:
    """What a gc pass would do with one checkpoint (nothing is done: a dry run).

    Attributes:
        step: the checkpoint's step.
        keep: retention keeps it.
        reasons: every rule that keeps it, or why none does (the run name left out).
        pins: why its fast copy must stay on the fast tier.
        tiers: ``(tier, action)`` per copy: ``keep``, ``trash``, ``purge`` or ``demote``.
        purge_after: seconds a trashed copy would wait before purge (dropped ones only).
    """

    step: int
    keep: bool
    reasons: tuple[str, ...]
    pins: tuple[str, ...]
    tiers: tuple[tuple[str, str], ...]
    purge_after: float | None = None

    @property
    def deletes(self) -> bool:
        """Some copy would go (trashed, purged or demoted)."""
        return any(action != "keep" for _, action in self.tiers)


@dataclass(frozen=True)
class Lifecycle:
    """The final checkpoints, the dry run's verdicts, and the run listed after it.

    ``rules`` says, per importance present in the run, what the policy owes it;
    ``trashed_after`` are the steps with a copy in the trash after the dry run.
    """

    states: tuple[CheckpointState, ...]
    gc: tuple[GcDecision, ...]
    rules: tuple[tuple[str, str], ...]
    listed_after: tuple[int, ...]
    trashed_after: tuple[int, ...]

    @property
    def deleted_nothing(self) -> bool:
        """After the dry run every checkpoint is still listed and no copy is in the trash."""
        return self.listed_after == tuple(s.step for s in self.states) and not self.trashed_after

    def importance(self, step: int) -> str:
        """The importance of ``step`` (empty if it is not a final checkpoint)."""
        return next((s.importance for s in self.states if s.step == step), "")

    def state(self, step: int) -> str:
        """The state of ``step`` (empty if it is not a final checkpoint)."""
        return next((s.state for s in self.states if s.step == step), "")


def _states(checkpointer: Checkpointer) -> tuple[CheckpointState, ...]:
    return tuple(
        CheckpointState(
            info.step,
            info.importance.value,
            info.state,
            tuple(c.tier for c in info.copies),
            tuple(c.tier for c in info.copies if c.trashed_at is not None),
            tuple(sorted(info.holds)),
        )
        for info in checkpointer.list()
    )


def describe_level(level: LevelPolicy) -> str:
    """What one importance level is owed, in a few words (placement, then retention)."""
    copies = f"{level.min_copies} {'verified ' if level.verify_before_counting else ''}copies"
    if level.all_durable_tiers:
        copies += ", one on every durable tier"
    if level.never_auto_delete:
        kept = "never auto-deleted"
    elif level.keep_last is None:
        kept = "all kept"
    else:
        kept = f"the last {level.keep_last} kept"
    return f"{copies}; {kept}"


def inspect_lifecycle(store: Store, run: str, *, now: float | None = None) -> Lifecycle:
    """Read the final state of ``run``'s checkpoints and dry-run retention on it.

    Args:
        store: the demo's store.
        run: the demo's run (other runs of the store are not looked at).
        now: the time retention decides at (default: now).
    """
    checkpointer = Checkpointer(store, run, background=False)
    states = _states(checkpointer)
    policy = store.policy
    report = apply_retention(store, policy, now=now, dry_run=True, runs=[run])
    importance = {s.step: Importance(s.importance) for s in states}
    decisions = []
    for d in report.decisions:
        tiers = tuple(
            (a.action.tier, a.action.action)
            for a in report.actions
            if (a.run, a.step) == (d.run, d.step)
        )
        level = importance.get(d.step)
        delay = None if d.keep or level is None else policy.trash_delay(level)
        decisions.append(
            GcDecision(
                d.step,
                d.keep,
                tuple(_without_run(r, run) for r in d.reasons),
                tuple(_without_run(r, run) for r in d.pin_reasons),
                tiers,
                delay,
            )
        )
    after = _states(checkpointer)
    present = [i for i in Importance if i in importance.values()]
    return Lifecycle(
        states=states,
        gc=tuple(decisions),
        rules=tuple((i.value, describe_level(policy.level(i))) for i in present),
        listed_after=tuple(s.step for s in after),
        trashed_after=tuple(s.step for s in after if s.trashed),
    )


def _without_run(reason: str, run: str) -> str:
    """The policy's reason without `` of run NAME`` (the demo shows one run)."""
    return reason.replace(f" of run {run}", "")


# --- display ---------------------------------------------------------------------

_OK, _BAD = "[bold green]✓[/]", "[bold red]✗[/]"
_GC_ACTION = {"keep": "[green]keep[/]", "trash": "[red]trash[/]", "purge": "[bold red]purge[/]",
              "demote": "[yellow]demote[/]"}  # fmt: skip


def render_lifecycle(life: Lifecycle, run: str, store: Path, tiers: Sequence[str]) -> Group:
    """Importance -> state of every final checkpoint, the dry run's verdicts, how to apply them."""
    run = escape(run)
    table = Table(
        title=f"Importance at work: gc [bold]DRY RUN[/] on run {run}", box=box.SIMPLE_HEAD
    )
    for name in ("step", "importance", "state", "gc", *tiers):
        table.add_column(name, justify="right" if name == "step" else "left", no_wrap=True)
    table.add_column("why (the policy)", ratio=1)
    for d in life.gc:
        state, actions = life.state(d.step), dict(d.tiers)
        pinned = "[green]pinned[/]" if d.pins else ""
        table.add_row(
            str(d.step),
            life.importance(d.step),
            f"[green]{state}[/]" if state == "protected" else f"[yellow]{state}[/]",
            "[green]KEEP[/]" if d.keep else "[bold red]DELETE[/]",
            *[
                (pinned if t == "fast" and actions.get(t) == "keep" else "")
                or _GC_ACTION.get(actions.get(t, ""), "[dim]·[/]")
                for t in tiers
            ],
            "\n".join(escape(r) for r in d.reasons),
        )
    lines = ["What the store's policy owes each importance (placement; retention):"]
    lines += [f"  [bold]{importance:>9}[/]  {owed}" for importance, owed in life.rules]
    doomed = ", ".join(str(d.step) for d in life.gc if d.deletes)
    if life.deleted_nothing:
        lines.append(
            f"{_OK} [bold]This was a dry run: nothing was deleted.[/] All"
            f" {len(life.listed_after)} checkpoints are still listed, none is in the trash;"
            f" gc would delete {'steps ' + doomed if doomed else 'nothing'}."
        )
    else:
        lines.append(
            f"{_BAD} [bold red]The dry run changed the store:[/] listed now"
            f" {escape(str(list(life.listed_after)))},"
            f" in the trash {escape(str(list(life.trashed_after)))}"
        )
    delays = {d.purge_after for d in life.gc if d.purge_after is not None}
    delay = f", purged {_delay(delays.pop())} later" if len(delays) == 1 else ", purged later"
    where = escape(shlex.quote(str(store)))
    lines.append(
        f"[bold]gc[/] shows the same; [bold]gc --apply[/] carries it out, through the trash"
        f" (copies marked trashed now{delay}):"
        f"\n  mouthguard --store {where} gc {run}\n  mouthguard --store {where} gc {run} --apply"
    )
    return Group(table, *(Text.from_markup(line) for line in lines))


def _delay(seconds: float) -> str:
    """``24 h`` for whole hours, else ``1d 2h 3m``-style."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return format_duration(seconds)
