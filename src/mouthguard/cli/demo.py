"""``mouthguard demo``: run the survival scenario and show what happened, with rich.

The scenario itself (:mod:`mouthguard.demo.scenario`) does the work and returns
a typed report; this module only displays: a live progress view while the
worker processes run, then tables of checkpoints, the resume point and the
bitwise comparison with the uninterrupted reference run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rich import box
from rich.console import Console, RenderableType
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

from mouthguard.cli.render import human_bytes
from mouthguard.demo import DemoEvent, DemoReport, Phase, SaveRecord, SaveStatus
from mouthguard.demo.scenario import run_scenario
from mouthguard.demo.worker import DemoError

_PHASE_STYLE = {
    Phase.TRAIN: "cyan",
    Phase.CORRUPT: "yellow",
    Phase.RESUME: "green",
    Phase.REFERENCE: "blue",
}
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
        if event.phase is not Phase.CORRUPT:  # corruption is instant: a log line, no bar
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


def run_demo(store_path: Path, console: Console) -> int:
    """Run the demo on the store at ``store_path``, printing to ``console``.

    Returns:
        0 if the resumed run ended bitwise identical to the uninterrupted
        reference run, 1 if it did not or the scenario could not run.

    Raises:
        MouthguardError: the store cannot be opened (the CLI reports it).
        ValueError: the store path is unusable (the CLI reports it).
    """
    console.print(
        Panel(
            "Train a model with periodic checkpoints, [red]SIGKILL[/] it in the middle of a save,"
            " [yellow]corrupt[/] its newest checkpoint, resume in a new process, and compare with"
            " a run that was never interrupted, bit for bit.",
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
            return 1
        view.finish()
    _show(report, console)
    return 0 if report.matches else 1


def _show(report: DemoReport, console: Console) -> None:
    console.print()
    console.print(_checkpoints_table(report))
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
    store = shlex.quote(str(report.store))
    console.print(
        f"\nThe demo took {report.seconds:.1f} s. Its checkpoints are in [bold]{report.run_dir}[/]."
        f"\nLook around:\n  mouthguard --store {store} ls {report.run}"
        f"\n  mouthguard --store {store} verify {report.run}",
        highlight=False,
    )


def _status(report: DemoReport, save: SaveRecord) -> str:
    if save.status is SaveStatus.KILLED:
        return "[bold red]killed mid-save[/]: never visible in list()"
    if save.status is SaveStatus.CORRUPTED:
        reasons = [r.reason for r in report.resume.rejections if r.step == save.step]
        # The reason's gist; the whole message is in the "What happened" panel.
        why = reasons[0].split(" (", 1)[0].split(": ")[-1] if reasons else "[red]NOT rejected[/]"
        return f"[bold yellow]corrupted[/] → [bold]rejected[/]: {why}"
    text = "[green]committed[/]"
    if save.phase is Phase.TRAIN and save.step == report.resume.step:
        text += " → [bold green]resume point[/]"
    return f"{text}, {save.detail}" if save.detail else text


def _checkpoints_table(report: DemoReport) -> Table:
    table = Table(
        title=f"Checkpoints of run {report.run}, as written", box=box.SIMPLE_HEAD, padding=(0, 1)
    )
    table.add_column("step", justify="right")
    table.add_column("importance")
    table.add_column("size", justify="right")
    table.add_column("save", justify="right")
    table.add_column("by")
    table.add_column("status")
    for save in report.saves:
        if save.status is SaveStatus.KILLED:
            share = save.nbytes / max(report.kill.expected_bytes, 1)
            size, seconds = f"{human_bytes(save.nbytes)} ({share:.0%})", "killed"
        else:
            size, seconds = human_bytes(save.nbytes), f"{save.seconds:.2f} s"
        style = _PHASE_STYLE[save.phase]
        table.add_row(
            str(save.step),
            save.importance,
            size,
            seconds,
            f"[{style}]{save.phase}[/]",
            _status(report, save),
        )
    return table


def _check(ok: bool) -> str:
    return _OK if ok else _BAD


def _short(path: Path, base: Path) -> str:
    """``path`` relative to ``base``, long random hex ids abbreviated (for reading, not pasting)."""
    try:
        text = str(path.relative_to(base))
    except ValueError:
        text = str(path)
    return re.sub(r"([0-9a-f]{8})[0-9a-f]{24,}", r"\1…", text)


def _events_panel(report: DemoReport) -> Panel:
    kill, bad, resume = report.kill, report.corruption, report.resume
    hidden = report.killed_step_hidden
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row(
        "job",
        f"MLP with {report.params:,} parameters and dropout, AdamW, warmup→cosine LR; randomness"
        " from torch's, NumPy's and Python's RNGs; all of it in every checkpoint"
        f" ({human_bytes(kill.expected_bytes)})",
    )
    grid.add_row(
        "[red]kill[/]",
        f"SIGKILL to pid {kill.pid} with {human_bytes(kill.bytes_on_disk)} of"
        f" {human_bytes(kill.expected_bytes)} of step {kill.step} written"
        f" ({_short(kill.file, report.run_dir)})",
    )
    listed = ", ".join(map(str, kill.listed_after_kill)) or "nothing"
    grid.add_row(
        "list()",
        f"{_check(hidden)} right after the kill: steps {listed}; step {kill.step} is"
        f" {'not ' if hidden else ''}there",
    )
    grid.add_row(
        "[yellow]corrupt[/]",
        f"{bad.length} bytes flipped in tensor {bad.tensor} of step {bad.step}"
        f" ({_short(bad.file, report.run_dir)}, byte {bad.offset:,})",
    )
    for warning in resume.warnings:
        grid.add_row("load()", f"[yellow]⚠ CheckpointFallbackWarning[/]: {warning}")
    if not report.corruption_rejected:
        grid.add_row("load()", f"{_BAD} the corrupted step {bad.step} was not rejected")
    loss = "" if resume.loss is None else f", loss there {resume.loss:.4f}"
    grid.add_row(
        "[green]resume[/]",
        f"from step [bold]{resume.step}[/], every byte verified ({resume.seconds:.2f} s{loss});"
        f" trained on to step {report.resumed.step}",
    )
    for name in report.set_aside:
        grid.add_row(
            "set aside",
            f"re-saving step {bad.step} moved the damaged copy to"
            f" {_short(report.run_dir / name, report.run_dir)}",
        )
    return Panel(grid, title="What happened", title_align="left", expand=False)


def _comparison_table(report: DemoReport) -> Table:
    ref, res = report.reference, report.resumed
    table = Table(title="Final state: reference vs resumed", box=box.SIMPLE_HEAD)
    table.add_column("")
    table.add_column("reference\n(never interrupted)")
    table.add_column("resumed\n(killed, corrupted)")
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
