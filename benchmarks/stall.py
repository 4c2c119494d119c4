"""The stall of ``save_async``: the first save, later saves, and saves while replication runs.

``python -m benchmarks.stall`` measures, on one state and one disk, in several
rounds whose modes are interleaved (so the disk's and the machine's drift hit
every mode alike):

* memcpy: the state copied into an already allocated and touched copy, the floor
  of any snapshot (median of three per round);
* first save_async of a new Checkpointer, without and with ``prepare(state)``
  (``prepare`` itself is timed too: it is the cost moved off the training path);
* steady save_async on one tier (nothing runs in the background);
* save_async on the default two-tier layout while the previous checkpoint is being
  replicated (the service's thread is copying or reading it back when the save
  starts), with background jobs yielding to the snapshot as shipped, and with
  their burst gate bypassed (what a store without yielding would do).

Every figure is the time ``save_async`` blocks the caller, from the call to its
return, measured by the caller. Saves are routine, every previous save has
committed before the next one starts (so no stall includes waiting for one), and
the report says per mode in how many rounds replication was really in flight when
the save started. Writes ``docs/benchmarks-stall.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import mouthguard
from benchmarks.harness import progress_bar
from benchmarks.report import load_line, machine_line
from benchmarks.state import REPO, build_state, parse_size, size_label, state_nbytes
from mouthguard.jobs.burst import BurstGate
from mouthguard.jobs.service import BackgroundService
from mouthguard.tiers.local import LocalTier

DEFAULT_OUT = REPO / "docs" / "benchmarks-stall.md"
RUN = "stall"
#: Longest wait for the background service to pick up a commit (bounded loop).
PICKUP_TIMEOUT_SECONDS = 10.0
#: The target: the stall with replication in flight, over a memcpy of the state.
TARGET_IN_FLIGHT = 1.25
#: The target: the first save's stall over the steady one (with prepare()).
TARGET_FIRST = 2.0
console = Console(stderr=True)

MEMCPY = "memcpy into a preallocated copy"
FIRST = "first save_async of a new Checkpointer"
PREPARE = "prepare(state) before the first save (not a stall: the cost moved off the loop)"
FIRST_PREPARED = "first save_async after prepare(state)"
STEADY = "save_async, one tier (steady)"
YIELDING = "save_async while the previous save replicates (jobs yield, as shipped)"
NOT_YIELDING = "save_async while the previous save replicates (burst gate bypassed)"


@dataclass
class Row:
    """One mode's timings over the rounds."""

    name: str
    times: list[float] = field(default_factory=list)
    in_flight: list[bool] = field(default_factory=list)


@contextlib.contextmanager
def gate_bypassed() -> Iterator[None]:
    """Background jobs never wait for a save: what they do without yielding."""
    real = BurstGate.wait

    def never_wait(_self: BurstGate, _timeout: float = 0.0) -> float:
        return 0.0

    BurstGate.wait = never_wait  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        BurstGate.wait = real  # type: ignore[method-assign]


def one_tier(root: Path) -> mouthguard.Checkpointer:
    store = mouthguard.Store([LocalTier(root / "fast", name="fast", domain="a")])
    return mouthguard.Checkpointer(store, RUN, background=False)


def two_tiers(root: Path) -> tuple[mouthguard.Checkpointer, BackgroundService]:
    """The embedded default: two local tiers in two failure domains, replication on."""
    store = mouthguard.open_store(root)
    ckpt = mouthguard.Checkpointer(store, RUN)
    service = store.listener()
    assert isinstance(service, BackgroundService)
    return ckpt, service


def memcpy_seconds(state: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for k, v in state.items():
            dst[k].copy_(v)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_save(ckpt: mouthguard.Checkpointer, step: int, state: object) -> float:
    t0 = time.perf_counter()
    handle = ckpt.save_async(step, state)
    stall = time.perf_counter() - t0
    handle.result()
    return stall


def remove_steps(root: Path, steps: range) -> None:
    """Remove old steps from both tiers: every manifest first, so that a background pass
    never finds one copy of a step gone and the other still committed (it would repair)."""
    dirs = [root / tier / RUN / f"{step:012d}" for step in steps for tier in ("fast", "durable")]
    for d in dirs:
        (d / "manifest.json").unlink(missing_ok=True)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


class Rounds:
    """The modes of the module docstring, one measurement of each per round."""

    def __init__(self, state: dict[str, torch.Tensor], root: Path) -> None:
        self.state, self.root = state, root
        self.rows = {n: Row(n) for n in (MEMCPY, FIRST, PREPARE, FIRST_PREPARED, STEADY)}
        self.rows |= {n: Row(n) for n in (YIELDING, NOT_YIELDING)}
        self.copy = {k: torch.empty_like(v) for k, v in state.items()}
        self.steady = one_tier(root / "steady")
        self.dirs = {YIELDING: root / "yielding", NOT_YIELDING: root / "bypassed"}
        self.replicating = {name: two_tiers(d) for name, d in self.dirs.items()}
        self.step = 0
        memcpy_seconds(state, self.copy)  # fault the copy's pages in, untimed
        timed_save(self.steady, self._next(), state)  # allocates its staging, untimed
        for ckpt, service in self.replicating.values():
            timed_save(ckpt, self._next(), state)
            service.wait_idle(600.0)

    def _next(self) -> int:
        self.step += 1
        return self.step

    def once(self, rotation: int) -> None:
        """One round: the memcpy reference, then every mode in an order rotated by round.

        Rotating matters: what ran just before (a fresh 1 GiB buffer freed, a
        replication finishing) changes the next memcpy by tens of percent on a VM.
        """
        self.rows[MEMCPY].times.append(memcpy_seconds(self.state, self.copy))
        modes = [self._first, self._steady, self._yielding, self._bypassed]
        shift = rotation % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            mode()

    def _steady(self) -> None:
        self.rows[STEADY].times.append(timed_save(self.steady, self._next(), self.state))
        remove_steps(self.root / "steady", range(1, self.step - 1))

    def _yielding(self) -> None:
        self._in_flight(self.rows[YIELDING], *self.replicating[YIELDING])

    def _bypassed(self) -> None:
        with gate_bypassed():
            self._in_flight(self.rows[NOT_YIELDING], *self.replicating[NOT_YIELDING])

    def _first(self) -> None:
        """A new Checkpointer's first save, with and without prepare (fresh staging each)."""
        for prepared in (False, True):
            d = self.root / f"first-{int(prepared)}"
            with contextlib.closing(one_tier(d)) as ckpt:
                if prepared:
                    t0 = time.perf_counter()
                    ckpt.prepare(self.state)
                    self.rows[PREPARE].times.append(time.perf_counter() - t0)
                row = self.rows[FIRST_PREPARED if prepared else FIRST]
                row.times.append(timed_save(ckpt, 1, self.state))
            shutil.rmtree(d, ignore_errors=True)
            gc.collect()

    def _in_flight(self, row: Row, ckpt: mouthguard.Checkpointer, svc: BackgroundService) -> None:
        """Commit a save, wait until its replication has started, then save again."""
        previous = self._next()
        ckpt.save_async(previous, self.state).result()  # commit: the service wakes
        deadline = time.monotonic() + PICKUP_TIMEOUT_SECONDS
        while not svc.status().busy and time.monotonic() < deadline:
            time.sleep(0.001)
        started_busy = svc.status().busy
        row.times.append(timed_save(ckpt, self._next(), self.state))
        row.in_flight.append(started_busy)
        svc.wait_idle(600.0)
        remove_steps(self.dirs[row.name], range(1, self.step - 1))

    def close(self) -> None:
        self.steady.close()
        for ckpt, service in self.replicating.values():
            ckpt.close()
            service.stop()


def ratio_text(times: list[float], memcpy: list[float]) -> tuple[str, float]:
    """Per-round ratio to that round's memcpy: ``median (min-max)``, and the max."""
    ratios = [t / m for t, m in zip(times, memcpy, strict=True)]
    text = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    return text, max(ratios)


def report(rows: dict[str, Row], nbytes: int, n_tensors: int, machine: str, command: str) -> str:
    memcpy = rows[MEMCPY].times
    steady = rows[STEADY].times
    lines = [
        "# save_async stall: first save, steady, and with replication in flight",
        "",
        "Generated by `benchmarks/stall.py`; do not edit by hand.",
        "",
        machine,
        "",
        "```bash",
        command,
        "```",
        "",
        f"State: {size_label(nbytes)} of fp32 ({n_tensors} tensors, CPU), {len(memcpy)} rounds,",
        "modes interleaved within each round, their order rotated from round to round.",
        "Every figure is the time `save_async` blocked the caller (call to return); each",
        "save's predecessor had committed first, so no",
        "figure includes waiting for a previous save. Ratios are per round, against that",
        "round's memcpy (median of three copies into an already touched copy of the state).",
        "*in flight* counts the rounds in which the background service was replicating the",
        "previous checkpoint (copying it or reading a copy back) when the save started.",
        "",
        "| mode | median s | min-max s | x memcpy (median, min-max) | in flight |",
        "|---|---|---|---|---|",
    ]
    worst: dict[str, float] = {}
    for row in rows.values():
        if not row.times:
            continue
        ratio, worst[row.name] = ratio_text(row.times, memcpy)
        flight = f"{sum(row.in_flight)}/{len(row.in_flight)}" if row.in_flight else ""
        lines.append(
            f"| {row.name} | {statistics.median(row.times):.3f} | "
            f"{min(row.times):.3f}-{max(row.times):.3f} | {ratio} | {flight} |"
        )
    first = [f / s for f, s in zip(rows[FIRST_PREPARED].times, steady, strict=True)]
    unprepared = [f / s for f, s in zip(rows[FIRST].times, steady, strict=True)]
    met = worst[YIELDING] <= TARGET_IN_FLIGHT and all(rows[YIELDING].in_flight)
    lines += [
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| stall with replication in flight <= {TARGET_IN_FLIGHT}x memcpy in every round | "
        f"worst round {worst[YIELDING]:.2f}x (gate bypassed: {worst[NOT_YIELDING]:.2f}x) | "
        f"{'**met**' if met else '**not met**'} |",
        f"| first save_async stall <= {TARGET_FIRST}x the steady stall | with prepare(): "
        f"worst {max(first):.2f}x; without: {statistics.median(unprepared):.2f}x median | "
        f"{'**met** (with prepare)' if max(first) <= TARGET_FIRST else '**not met**'} |",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stall", description=__doc__)
    parser.add_argument("--size", default="1G", help="state size (default 1G)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("need at least one round")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nbytes = parse_size(args.size)
    base = Path(tempfile.gettempdir()) if args.dir is None else args.dir
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".mouthguard-stall-", dir=base))
    rounds_arg = str(args.rounds)
    command = shlex.join(
        [".venv/bin/python", "-m", "benchmarks.stall", "--size", args.size, "--rounds", rounds_arg]
    )
    try:
        machine = machine_line(root)
        load_before = os.getloadavg()
        state = build_state(nbytes)
        rounds = Rounds(state, root)
        try:
            with progress_bar(console) as progress:
                task = progress.add_task(f"{size_label(nbytes)}: rounds", total=args.rounds)
                for r in range(args.rounds):
                    rounds.once(r)
                    progress.advance(task)
        finally:
            rounds.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine = f"{machine}\n\n{load_line(load_before, os.getloadavg())}"
    text = report(rounds.rows, state_nbytes(state), len(state), machine, command)
    table = Table("mode", "median s", "rounds")
    for row in rounds.rows.values():
        table.add_row(row.name, f"{statistics.median(row.times):.3f}", str(len(row.times)))
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
