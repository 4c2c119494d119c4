"""``mouthguard demo``: run the survival scenario and show what happened, with rich.

The scenario itself (:mod:`mouthguard.demo.scenario`) does the work and returns
a typed report; this module only displays: a live progress view while the
worker processes run, then the checkpoints and their copies on every tier, what
happened in order (kill, damage, what ``load()`` rejected, where the resume read
from, repairs), the final verification of the store, and the bitwise
comparison with the uninterrupted reference run; last, importance at work: each
final checkpoint's state and what ``gc`` would do to it (a dry run); and how
much disk the run left in the store, with how to remove it. With ``--json``
nothing is shown while it runs, and one JSON object is printed at the end
(:func:`mouthguard.cli.demo_summary.report_json`).
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path

from rich import box
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from mouthguard.cli.common import EXIT_FAILED, EXIT_OK
from mouthguard.cli.demo_summary import DiskUse, TrailTail, disk_use, report_json, trail_tail
from mouthguard.cli.render import human_bytes
from mouthguard.demo import (
    DamageKind,
    DemoEvent,
    DemoReport,
    Phase,
    SaveRecord,
    SaveStatus,
)
from mouthguard.demo.diverged import DivergedRecord
from mouthguard.demo.lifecycle import render_lifecycle
from mouthguard.demo.process import DemoError
from mouthguard.demo.scenario import run_scenario

_PHASE_STYLE = {
    Phase.TRAIN: "cyan",
    Phase.DAMAGE: "yellow",
    Phase.RESUME: "green",
    Phase.VERIFY: "magenta",
    Phase.REFERENCE: "blue",
}
#: Phases done by the scenario itself, at once: log lines, no progress bar.
_INSTANT = {Phase.DAMAGE, Phase.VERIFY}
_OK, _BAD = "[bold green]✓[/]", "[bold red]✗[/]"


class _PhaseIcon(SpinnerColumn):
    """A spinner while a phase runs; then the icon the view set (finished or interrupted)."""

    def render(self, task: Task) -> RenderableType:
        """The task's ``icon`` field if set, else the spinner."""
        icon = task.fields.get("icon")
        return Text.from_markup(icon) if icon else super().render(task)


class _ProgressView:
    """Turns scenario events into one progress bar per training phase, plus log lines."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[Phase, TaskID] = {}
        self.current: Phase | None = None

    def __call__(self, event: DemoEvent) -> None:
        if event.phase not in _INSTANT:
            task = self._task(event)
            self.progress.update(task, completed=event.step)
            if event.loss is not None:  # notices without a loss keep the last one shown
                self.progress.update(task, status=f"loss {event.loss:.4f}")
        if event.message:
            style = _PHASE_STYLE[event.phase]
            self.progress.console.print(
                f"  [{style}]{event.phase:>11}[/]  {event.message}", highlight=False
            )

    def _task(self, event: DemoEvent) -> TaskID:
        if event.phase not in self.tasks:
            self.finish()
            self.tasks[event.phase] = self.progress.add_task(
                f"[{_PHASE_STYLE[event.phase]}]{event.phase}",
                total=event.total_steps,
                status="",
                icon="",
            )
            self.current = event.phase
        return self.tasks[event.phase]

    def finish(self, *, failed: bool = False) -> None:
        """Stop the running phase's bar; one that stopped short was interrupted."""
        if self.current is None:
            return
        task_id = self.tasks[self.current]
        task = next(t for t in self.progress.tasks if t.id == task_id)
        if failed:
            icon, status = "[red]✗[/]", "[red]failed[/]"
        elif task.total is not None and task.completed < task.total:
            icon, status = "[red]⚡[/]", f"[red]killed at step {int(task.completed)}[/]"
        else:
            icon, status = "[green]✓[/]", task.fields.get("status", "")
        self.progress.update(task_id, icon=icon, status=status)
        self.progress.stop_task(task_id)
        self.current = None


def run_demo(store_path: Path, console: Console, *, as_json: bool = False) -> int:
    """Run the demo on the store at ``store_path``, printing to ``console`` (or JSON).

    Returns:
        0 if the resumed run ended bitwise identical to the uninterrupted
        reference run and every copy left in the store verified; 1 if not, or
        if the scenario could not run.

    Raises:
        MouthguardError: the store cannot be opened (the CLI reports it).
        ValueError: the store path is unusable (the CLI reports it).
    """
    if as_json:
        try:
            report = run_scenario(store_path)
        except DemoError as exc:
            print(json.dumps({"ok": False, "store": str(store_path), "error": str(exc)}))
            return EXIT_FAILED
        print(json.dumps(report_json(report, disk_use(report), trail_tail(report))))
        return EXIT_OK if report.matches and report.store_verified else EXIT_FAILED
    console.print(
        Panel(
            "Train a model with periodic checkpoints replicated to a second tier,"
            " [red]SIGKILL[/] it in the middle of a save, [yellow]corrupt[/] both copies of its"
            " newest checkpoint and [yellow]delete[/] a file of the one before, resume in a new"
            " process, and compare with a run that was never interrupted, bit for bit.",
            title="[bold]mouthguard demo[/]",
            expand=False,
        )
    )
    console.print(f"store: [bold]{store_path}[/]", highlight=False)
    columns = (
        _PhaseIcon(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps  {task.fields[status]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        view = _ProgressView(progress)
        try:
            report = run_scenario(store_path, on_event=view)
        except DemoError as exc:
            view.finish(failed=True)
            console.print(f"[bold red]✗ the demo could not run:[/] {exc}", highlight=False)
            return EXIT_FAILED
        view.finish()
    _show(report, console)
    return EXIT_OK if report.matches and report.store_verified else EXIT_FAILED


def _show(report: DemoReport, console: Console) -> None:
    console.print()
    console.print(_checkpoints_table(report, console.width))
    console.print(_events_panel(report))
    console.print(_comparison_table(report))
    if report.matches:
        console.print(
            f"{_OK} [bold green]The resumed run is bitwise identical to the reference:[/] the same"
            f" final loss, the same bytes in all {report.resumed.tensors} model tensors and in"
            " the optimizer state."
        )
    else:
        console.print(f"{_BAD} [bold red]The resumed run differs from the reference.[/]")
    console.print(f"{_check(report.store_verified)} {_verified(report)}", highlight=False)
    console.print(render_lifecycle(report.lifecycle, report.run, report.store, report.tiers))
    if report.diverged is not None:
        console.print(_diverged(report.diverged), highlight=False)
    stall = _stall_summary(report)
    if stall:
        console.print(stall, highlight=False)
    store = shlex.quote(str(report.store))
    console.print(
        f"\nThe demo took {report.seconds:.1f} s. Its checkpoints are in [bold]{report.run_dir}[/]"
        f" (and the other tiers of the store).\nLook around:"
        f"\n  mouthguard --store {store} ls {report.run}"
        f"\n  mouthguard --store {store} verify {report.run}",
        highlight=False,
    )
    console.print(_disk_note(disk_use(report), store), highlight=False)
    _trail(trail_tail(report), store, report.run, console)


def _trail(tail: TrailTail, store: str, run: str, console: Console) -> None:
    """The last acts of the run's audit trail, and whether its chains check out."""
    verdict = "intact" if tail.intact else f"[red]broken[/red] ({'; '.join(tail.breaks)})"
    console.print(
        f"\nThe audit trail recorded {tail.total} acts on this run (chains {verdict}); these"
        f" {len(tail.acts)} among them:",
        highlight=False,
    )
    for act in tail.acts:
        r = act.intent.record
        step = "-" if r.step is None else str(r.step)
        console.print(
            f"  {r.time[11:23]}  {escape(r.actor)}  {r.act:<10} step {step:>3} on"
            f" {escape(','.join(r.tiers))}: {escape(act.status)} ({escape(r.reason)})",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"  mouthguard --store {store} audit {run}    # all of it; --check verifies the chains",
        highlight=False,
    )


def _diverged(record: DivergedRecord) -> str:
    """One paragraph: the NaN checkpoint skipped by a resume that checks the state."""
    return (
        f"\n{_check(record.ok)} [bold]A checkpoint can verify and still be dead.[/] Run"
        f" {record.run} saved step {record.good_step}, then step {record.nan_step} with a NaN in"
        f" {record.poisoned} (its bytes are intact: every checksum passes). A resume with"
        f" load(check=mouthguard.checks.finite()) returned step {record.resumed_step};"
        f" step {record.nan_step} is marked suspect ({record.suspect})."
    )


def _disk_note(disk: DiskUse, store: str) -> str:
    """How much the run left and where, and how to remove it: demo runs accumulate."""
    return (
        f"\nThis run left {human_bytes(disk.run_bytes)} on disk in {store}, which now holds"
        f" {human_bytes(disk.store_bytes)} (every demo run adds its own). Remove it when done:"
        f"\n  rm -rf {store}        # `make clean` does this for ./mouthguard-store"
    )


def _verified(report: DemoReport) -> str:
    """``N copies on T tiers verified, K invalid``, naming the invalid ones."""
    checks = report.verification
    bad = [c for c in checks if not c.ok]
    tiers = len({c.tier for c in checks})
    text = f"{len(checks) - len(bad)} copies on {tiers} tiers verified, {len(bad)} invalid"
    return text + "".join(f"\n  step {c.step} on {c.tier}: {c.reason}" for c in bad)


def _resaved(report: DemoReport, step: int) -> bool:
    return any(s.step == step and s.phase is Phase.RESUME for s in report.saves)


def _status(report: DemoReport, save: SaveRecord) -> str:
    if save.status is SaveStatus.KILLED:
        return "[bold red]killed mid-save[/], never in list()"
    if save.phase is not Phase.TRAIN:
        return save.detail or "[green]committed[/]"
    damage = [d for d in report.damage if d.step == save.step]
    if save.status is SaveStatus.CORRUPTED:
        rejected = {r.tier for r in report.resume.rejections if r.step == save.step}
        tiers = [d.tier for d in damage]
        why = "[bold]rejected[/]" if rejected >= set(tiers) else "[red]NOT rejected[/]"
        return f"[bold yellow]corrupted on {' and '.join(tiers)}[/] → {why}"
    parts = [
        f"[yellow]{'file ' if d.kind is DamageKind.DELETED else ''}{d.kind} on {d.tier}[/]"
        for d in damage
    ]
    if save.step == report.resume.step:
        parts.append(f"[bold green]resume point[/], read from {report.resume.tier}")
    return " → ".join(parts) or "[green]committed[/]"


def _copies(report: DemoReport, save: SaveRecord) -> str:
    """Each tier's copy: ✓ verified, ✗ damaged (→ ✓ repaired), · none."""
    if save.status is SaveStatus.KILLED:
        return "[dim]none: partial dir[/]"
    final = {c.tier: c.ok for c in report.verification if c.step == save.step}
    if save.phase is Phase.TRAIN:
        marks = {c.tier: c.ok for c in report.replicas if c.step == save.step}
        damaged = {d.tier for d in report.damage if d.step == save.step}
        repaired = {} if _resaved(report, save.step) else final
    else:
        marks, damaged, repaired = final, set(), {}
    cells = []
    for tier in report.tiers:
        if tier in damaged:
            mark = _BAD + (f"→{_OK}" if repaired.get(tier) else "")
        else:
            mark = _check(marks[tier]) if tier in marks else "[dim]·[/]"
        cells.append(f"{tier} {mark}")
    return " ".join(cells)


def _checkpoints_table(report: DemoReport, width: int) -> Table:
    """One row per save attempt; below 100 columns without size and duration (see the panel)."""
    wide = width >= 100
    table = Table(
        title=f"Checkpoints of run {report.run}, as written", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("importance", no_wrap=True)
    if wide:
        table.add_column("size", justify="right", no_wrap=True)
        table.add_column("save", justify="right", no_wrap=True)
        table.add_column("stall (memcpy)", justify="right", no_wrap=True)
    table.add_column("by")
    table.add_column("copies")
    table.add_column("status")
    for save in report.saves:
        killed = save.status is SaveStatus.KILLED
        style = _PHASE_STYLE[save.phase]
        cells = [str(save.step), save.importance]
        if wide:
            cells += [
                human_bytes(save.nbytes),
                "killed" if killed else f"{save.seconds:.2f} s",
                "" if killed else _stall(save),
            ]
        cells += [f"[{style}]{save.phase}[/]", _copies(report, save), _status(report, save)]
        table.add_row(*cells)
    return table


def _stall_summary(report: DemoReport) -> str:
    """One line: the median stall of the committed async saves beside the median memcpy."""
    saves = [s for s in report.saves if s.status is not SaveStatus.KILLED and s.memcpy_seconds > 0]
    if not saves:
        return ""
    stall = statistics.median(s.stall_seconds for s in saves)
    memcpy = statistics.median(s.memcpy_seconds for s in saves)
    return (
        f"\nSaves are asynchronous: training was blocked a median {stall * 1000:.1f} ms per save"
        f" (the snapshot), beside {memcpy * 1000:.1f} ms for a plain memcpy of the same state"
        f" ({stall / memcpy:.1f}x); writing, checksums, commit and replication ran behind it."
    )


def _stall(save: SaveRecord) -> str:
    """The time training was blocked, beside a memcpy of the same state."""
    return f"{save.stall_seconds * 1000:.1f} ms ({save.memcpy_seconds * 1000:.1f} ms)"


def _check(ok: bool) -> str:
    return _OK if ok else _BAD


def _short(text: str | Path, base: Path | None = None) -> str:
    """``text`` (relative to ``base``), long hex ids abbreviated (for reading, not pasting)."""
    if isinstance(text, Path) and base is not None and text.is_relative_to(base):
        text = text.relative_to(base)
    return re.sub(r"([0-9a-f]{8})[0-9a-f]{24,}", r"\1…", str(text))


def _events_panel(report: DemoReport) -> Panel:
    kill, resume = report.kill, report.resume
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row(
        "job",
        f"MLP with {report.params:,} parameters and dropout, AdamW, warmup→cosine LR; randomness"
        " from torch's, NumPy's and Python's RNGs; all of it in every checkpoint"
        f" ({human_bytes(kill.expected_bytes)})",
    )
    listed = ", ".join(map(str, kill.listed_after_kill)) or "nothing"
    replicated = all(c.ok for c in report.replicas)
    grid.add_row(
        "replicate",
        f"{_check(replicated)} steps {listed}: each verified on {' and '.join(report.tiers)}"
        " before training went on",
    )
    grid.add_row(
        "[red]kill[/]",
        f"SIGKILL to pid {kill.pid} with {human_bytes(kill.bytes_on_disk)} of"
        f" {human_bytes(kill.expected_bytes)} of step {kill.step} written"
        f" ({_short(kill.file, report.run_dir)})",
    )
    hidden = report.killed_step_hidden
    grid.add_row(
        "list()",
        f"{_check(hidden)} right after the kill: steps {listed}; step {kill.step} is"
        f" {'not ' if hidden else ''}there",
    )
    for d in report.damage:
        where = _short(d.file, d.file.parent.parent)
        if d.kind is DamageKind.DELETED:
            grid.add_row("[yellow]delete[/]", f"step {d.step} on {d.tier}: {where} deleted")
        else:
            grid.add_row(
                "[yellow]corrupt[/]",
                f"step {d.step} on {d.tier}: {d.length} bytes flipped in tensor {d.tensor}"
                f" ({where}, byte {d.offset:,})",
            )
    for warning in resume.warnings:
        text = warning.replace(f"checkpoint {report.run} ", "", 1).replace(f"{report.run}/", "")
        text = re.sub(r" \(/[^)]*\)|; trying another copy.*$", "", text)
        grid.add_row("load()", f"[yellow]⚠ CheckpointFallbackWarning[/]: {_short(text)}")
    if not report.damage_rejected:
        grid.add_row("load()", f"{_BAD} a damaged copy was not rejected")
    loss = "" if resume.loss is None else f", loss there {resume.loss:.4f}"
    grid.add_row(
        "[green]resume[/]",
        f"from step [bold]{resume.step}[/], read from tier [bold]{resume.tier}[/], every byte"
        f" verified ({resume.seconds:.2f} s{loss}); trained on to step {report.resumed.step}",
    )
    final = {(c.step, c.tier): c.ok for c in report.verification}
    for d in report.damage:
        if _resaved(report, d.step):
            continue
        ok = final.get((d.step, d.tier), False)
        sources = [c.tier for c in report.verification if c.step == d.step and c.tier != d.tier]
        grid.add_row(
            "repair",
            f"{_check(ok)} {d.tier} copy of step {d.step}"
            + (
                f" restored by background replication from {', '.join(sources)}, verified"
                if ok
                else " not repaired"
            ),
        )
    # The re-save's set-aside came first; then replication's, newest step first.
    for aside in sorted(report.set_aside, key=lambda a: (a.by == "replication", -a.step)):
        grid.add_row(
            "set aside",
            f"step {aside.step} on {aside.tier} → {_short(aside.name)}, by {aside.by}",
        )
    grid.add_row("verify", f"{_check(report.store_verified)} {_verified(report)}")
    return Panel(grid, title="What happened", title_align="left", expand=False)


def _comparison_table(report: DemoReport) -> Table:
    ref, res = report.reference, report.resumed
    table = Table(title="Final state: reference vs resumed", box=box.SIMPLE_HEAD)
    table.add_column("")
    table.add_column("reference\n(never interrupted)")
    table.add_column("resumed\n(killed, damaged)")
    table.add_column("match", justify="center")
    rows = (
        ("final step", str(ref.step), str(res.step)),
        ("final loss", f"{ref.loss:.8f}\n{ref.loss_hex}", f"{res.loss:.8f}\n{res.loss_hex}"),
        (
            f"weights sha256\n({ref.tensors} tensors)",
            ref.weights_sha256[:16] + "…",
            res.weights_sha256[:16] + "…",
        ),
        ("optimizer sha256", ref.optimizer_sha256[:16] + "…", res.optimizer_sha256[:16] + "…"),
    )
    exact = (
        ref.step == res.step,
        ref.loss_hex == res.loss_hex,
        ref.weights_sha256 == res.weights_sha256,
        ref.optimizer_sha256 == res.optimizer_sha256,
    )
    for (name, a, b), ok in zip(rows, exact, strict=True):
        table.add_row(name, a, b, _check(ok))
    return table
