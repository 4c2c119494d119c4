"""``mouthguard verify`` and ``mouthguard scrub``: read copies back and say what was found.

Both judge each copy through
:func:`~mouthguard.checkpoint.verification.verify_and_record`, so they agree:
``valid`` / ``ok`` (every byte matched; a receipt was recorded, or the output
says why it could not be), damaged (proven damage, reported for repair; verify
prints ``INVALID (damaged)``, scrub ``DAMAGED``) or unreachable (the tier failed;
nothing is concluded). Exit 0 only when every
copy read back intact. ``verify`` also names a checkpoint whose state a check
refused ``suspect``, with the reason, as ``ls`` does: its bytes may be valid,
but a resume skips it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.loading import suspect_reason
from mouthguard.checkpoint.sidecars import CopyRef, check_sidecars
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import Status, Verdict, find_copies, verify_and_record
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, UsageError
from mouthguard.cli.listing import Listed, damaged_checkpoints, item_name
from mouthguard.cli.render import human_bytes, progress
from mouthguard.errors import MouthguardError
from mouthguard.jobs.burst import MAX_YIELD_SECONDS, BurstGate
from mouthguard.jobs.scrub import ScrubReport, scrub


def _result_cell(v: Verdict, *, ok_word: str, bad_word: str | None = None) -> str:
    """``ok_word``, or the status (``DAMAGED``/``unreachable``) after ``bad_word`` if given."""
    if v.ok:
        cell = f"[green]{ok_word}[/green]"
        if v.record_error:
            cell += f" (receipt not recorded: {escape(v.record_error)})"
        return cell
    status = "damaged" if v.damaged else "unreachable"
    color = "red" if v.damaged else "yellow"
    word = f"{bad_word} ({status})" if bad_word else (status.upper() if v.damaged else status)
    return f"[{color}]{word}[/{color}]: {escape(v.reason)}"


# --- verify --------------------------------------------------------------------------


def verify(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Verify every committed copy (of a run, of a step); exit 1 unless all are intact."""
    if args.step is not None:
        catalog.validate_step(args.step)
    if args.run is not None:
        catalog.validate_run(args.run)
    refs = find_copies(store, args.run, args.step)
    if not refs:
        if args.run is None:
            console.print(f"nothing to verify in {store.source}", highlight=False)
            return EXIT_OK
        what = args.run if args.step is None else f"{args.run} step {args.step}"
        raise UsageError(f"no committed checkpoint {what} in {store.source}")
    verdicts = _run_verification(refs, console, quiet=args.json)
    suspects = _suspects(store, verdicts)
    if args.json:
        for v in verdicts:
            print(json.dumps({**v.to_json(), "suspect": suspects.get((v.run, v.step)) or None}))
    else:
        _print_verdicts(verdicts, suspects, console)
    return EXIT_OK if all(v.ok for v in verdicts) else EXIT_FAILED


def _suspects(store: Store, verdicts: list[Verdict]) -> dict[tuple[str, int], str]:
    """Why each verified checkpoint is suspect, for those that are (as ``ls`` says it).

    Verification judges bytes; a suspect checkpoint's bytes may all match while a
    resume skips it, so the byte verdict alone would contradict ``ls``.
    """
    found = {}
    for run, step in sorted({(v.run, v.step) for v in verdicts}):
        reason = suspect_reason(store.tiers, run, step, store.manifest_keys)
        if reason:
            found[(run, step)] = reason
    return found


def _run_verification(refs: list[CopyRef], console: Console, *, quiet: bool) -> list[Verdict]:
    with Progress(console=console, transient=True, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task("verifying", total=len(refs))
        verdicts = []
        for ref in refs:
            # Sidecars first, as found: the data check below rewrites the receipt.
            damaged = sidecar_problems(ref)
            verdict = verify_and_record(ref)
            if damaged:
                why = "; ".join(damaged if verdict.ok else [verdict.reason, *damaged])
                verdict = dataclasses.replace(verdict, status=Status.DAMAGED, reason=why)
            verdicts.append(verdict)
            bar.advance(task)
        return verdicts


def sidecar_problems(ref: CopyRef) -> list[str]:
    """Every sidecar of one copy that fails its checksum or does not parse, naming tier and file."""
    where = f"sidecar on {ref.tier.name}"
    try:
        damaged = check_sidecars(ref)
    except MouthguardError as exc:
        return [f"{where}: cannot read the sidecars: {exc}"]
    return [f"{where} {name} is damaged: {why}" for name, why in damaged]


def _print_verdicts(
    verdicts: list[Verdict], suspects: dict[tuple[str, int], str], console: Console
) -> None:
    table = Table(title="verification", title_justify="left")
    for column in ("run", "step", "tier", "size", "result"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for v in verdicts:
        size = human_bytes(v.nbytes) if v.nbytes else "?"
        result = _result_cell(v, ok_word="valid", bad_word="INVALID")
        suspect = suspects.get((v.run, v.step))
        if suspect:
            result += f"; [yellow]suspect[/yellow]: {escape(suspect)} (a resume skips it)"
        table.add_row(escape(v.run), str(v.step), escape(v.tier), size, result)
    console.print(table)
    bad = sum(not v.ok for v in verdicts)
    unrecorded = sum(bool(v.ok and v.record_error) for v in verdicts)
    summary = f"{len(verdicts) - bad} valid, {bad} invalid"
    if suspects:
        summary += f"; {len(suspects)} checkpoint(s) suspect (intact bytes, a resume skips them)"
    if unrecorded:
        summary += f" ({unrecorded} valid receipts could not be recorded: is the store read-only?)"
    console.print(f"[red]{summary}[/red]" if bad else f"[green]{summary}[/green]", highlight=False)


# --- scrub ---------------------------------------------------------------------------


class _CountingGate(BurstGate):
    """A burst gate that also advances a progress bar: the scrubber waits once per copy."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        super().__init__()
        self.progress, self.task, self.started = progress, task, 0

    def wait(self, timeout: float = MAX_YIELD_SECONDS) -> float:
        """Count the copy about to be read, then yield to saves as usual."""
        self.started += 1
        self.progress.update(self.task, description=f"scrubbing copy {self.started}")
        return super().wait(timeout)


def scrub_command(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Re-read copies now; exit 1 when a copy is damaged or unreachable, or a checkpoint lost."""
    with progress(console, show=not args.json and console.is_terminal) as bar:
        task = bar.add_task("scrubbing", total=None)
        report = scrub(
            store,
            max_age_seconds=args.max_age_seconds,
            budget_bytes=args.budget_bytes,
            gate=_CountingGate(bar, task),
        )
    # Checkpoints damaged on every tier, including copies this pass skipped as fresh.
    lost = damaged_checkpoints(store)
    if args.json:
        for v in report.results:
            print(json.dumps({"kind": "copy", **v.to_json()}))
        for item in lost:
            line = {"kind": "damaged_checkpoint", "run": item.run, "step": item.step}
            print(json.dumps({**line, "copies": [c.to_json() for c in item.copies]}))
        for unlisted in report.unlisted:
            print(json.dumps({"kind": "unlisted_tier", "reason": unlisted}))
        counts = {**report.counts(), "damaged_checkpoints": len(lost)}
        print(json.dumps({"kind": "summary", **counts}))
    else:
        _print_scrub(report, lost, console)
    clean = all(v.ok for v in report.results) and not lost and not report.unlisted
    return EXIT_OK if clean else EXIT_FAILED


def _print_scrub(report: ScrubReport, lost: list[Listed], console: Console) -> None:
    if report.results:
        table = Table(title="scrub", title_justify="left")
        for column in ("run", "step", "tier", "size", "result"):
            table.add_column(column, justify="right" if column in ("step", "size") else "left")
        for v in report.results:
            size = human_bytes(v.nbytes) if v.nbytes else "?"
            result = _result_cell(v, ok_word="ok")
            table.add_row(escape(v.run), str(v.step), escape(v.tier), size, result)
        console.print(table)
    for unlisted in report.unlisted:
        console.print(f"[yellow]tier not listed[/yellow]: {escape(unlisted)}", highlight=False)
    c = report.counts()
    summary = (
        f"{c['ok']} ok, {c['damaged']} damaged, {c['unreachable']} unreachable; "
        f"{c['skipped_fresh']} skipped (verified within --max-age-seconds)"
    )
    if c["skipped_budget"]:
        summary += f", {c['skipped_budget']} not reached (--budget-bytes)"
    bad = c["damaged"] + c["unreachable"] + len(lost) + len(report.unlisted)
    console.print(f"[red]{summary}[/red]" if bad else f"[green]{summary}[/green]", highlight=False)
    for item in lost:
        console.print(
            f"[red]{escape(item_name(item))} is damaged on every tier[/red]: no intact copy "
            "is left to repair from; its copies stay in place for inspection",
            highlight=False,
            soft_wrap=True,
        )
    if c["damaged"]:
        console.print(
            "damaged copies are reported; `mouthguard replicate` confirms the damage with "
            "a second read and replaces them from an intact copy",
            highlight=False,
            soft_wrap=True,
        )
