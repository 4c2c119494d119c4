"""How long a Lightning training loop is blocked by a checkpoint save, per CheckpointIO.

    .venv/bin/python -m benchmarks.trainer_stall                   # 512 MiB state, 5 saves
    .venv/bin/python -m benchmarks.trainer_stall --size 64M --saves 2 --dir /tmp/x

Every plug-in gets the same Lightning-shaped checkpoint dict (``state_dict`` plus
two Adam moments per weight; ``--size`` is all of its tensor bytes) and is called
the way ``Trainer.save_checkpoint`` calls it, on one thread, one save after another:

* ``first stall`` and ``stall (median of the rest)``: how long ``save_checkpoint``
  blocks the caller -- what the training loop loses per save. Between saves the
  caller sleeps ``--gap`` seconds (the training steps between two checkpoints),
  so an asynchronous plug-in's previous save has finished and its stall is its
  snapshot; the first save also pays for setting up (staging buffers, threads);
* ``last save written``: from the last save's call until ``teardown`` returned
  (the whole save for a synchronous plug-in).

Rows: Lightning's default ``TorchCheckpointIO`` (``torch.save``, no fsync), Lightning's
``AsyncCheckpointIO`` around it (clones the tensors, then ``torch.save`` in a
thread), and mouthguard's ``CheckpointIO`` (snapshot into a reused staging buffer,
then checksums, O_DIRECT write, fsync and commit in a thread; one local tier, no
replication). Only mouthguard's saves are durable (fsynced) when they count as
written. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from rich.console import Console
from rich.table import Table

from benchmarks.report import load_line, machine_line
from benchmarks.state import build_state, parse_size, size_label
from mouthguard.checkpoint.store import Store
from mouthguard.format.state_tree import iter_tensors
from mouthguard.integrations.lightning import CheckpointIO
from mouthguard.tiers.local import LocalTier

Plugin = Any


def lightning_dict(nbytes: int) -> dict[str, Any]:
    """A checkpoint dict shaped as Lightning's: weights, and Adam's two moments per weight."""
    weights = build_state(nbytes // 3)
    state = {
        i: {"step": torch.tensor(10.0), "exp_avg": w.clone(), "exp_avg_sq": w.clone()}
        for i, w in enumerate(weights.values())
    }
    return {
        "epoch": 0,
        "global_step": 10,
        "state_dict": weights,
        "optimizer_states": [{"state": state, "param_groups": [{"lr": 1e-3, "params": []}]}],
        "loops": {"fit_loop": {"epoch_loop.batch_progress": {"is_last_batch": False}}},
    }


def measure(
    plugin: Plugin, checkpoint: dict[str, Any], where: Path, saves: int, gap: float
) -> tuple[float, float, float]:
    """``(first stall, median stall of the rest, last save's call until teardown returned)``."""
    stalls = []
    before = time.perf_counter()
    for number in range(saves):
        if number:
            time.sleep(gap)
        checkpoint["global_step"] = 10 * (number + 1)
        before = time.perf_counter()
        plugin.save_checkpoint(checkpoint, where / f"step={number}.ckpt")
        stalls.append(time.perf_counter() - before)
    plugin.teardown()
    written = time.perf_counter() - before
    return stalls[0], statistics.median(stalls[1:] or stalls), written


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def plugins(root: Path) -> dict[str, Callable[[], Plugin]]:
    """Each row's plug-in, built fresh in its own directory."""
    return {
        "Lightning TorchCheckpointIO (torch.save, no fsync)": TorchCheckpointIO,
        "Lightning AsyncCheckpointIO(TorchCheckpointIO)": lambda: AsyncCheckpointIO(
            TorchCheckpointIO()
        ),
        "mouthguard CheckpointIO (async, fsynced, verified)": lambda: CheckpointIO(
            Store([LocalTier(root / "store", name="fast")]), run="bench", background=False
        ),
    }


def main(argv: list[str] | None = None) -> None:
    """Run every row and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("512M"))
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between saves")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="mg-trainer-stall-"))
    console = Console(stderr=True, width=120)
    checkpoint = lightning_dict(args.size)
    load_before = os.getloadavg()
    tensors = [t for _, t in iter_tensors(checkpoint)]
    clone = statistics.median(_timed(lambda: [t.clone() for t in tensors]) for _ in range(3))
    title = f"Lightning save_checkpoint, {size_label(args.size)} of tensors, {args.gap:g} s apart"
    table = Table(title=title)
    for column in ("plug-in", "first stall", "stall (median of the rest)", "last save written"):
        table.add_column(column, justify="left" if column == "plug-in" else "right")
    table.add_row("clone every tensor (the copy an async save cannot avoid)", "", _ms(clone), "")
    try:
        for number, (name, build) in enumerate(plugins(base).items()):
            where = base / f"row-{number}"
            where.mkdir(parents=True, exist_ok=True)
            first, stall, written = measure(build(), checkpoint, where, args.saves, args.gap)
            table.add_row(name, _ms(first), _ms(stall), _ms(written))
            shutil.rmtree(where, ignore_errors=True)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    console.print(table)
    console.print(machine_line(base.parent))
    console.print(load_line(load_before, os.getloadavg()))


if __name__ == "__main__":
    main()
