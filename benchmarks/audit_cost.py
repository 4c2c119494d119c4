"""What the audit trail costs a checkpoint save: the same saves with the trail on and off.

    .venv/bin/python -m benchmarks.audit_cost                  # 1 KiB, 64 MiB, 256 MiB states
    .venv/bin/python -m benchmarks.audit_cost --sizes 1K,2G --rounds 7

Every round saves each state once with the trail and once without
(``MOUTHGUARD_AUDIT=off``), alternating which goes first, into one local tier
(fsync on, no replication, no manifest key: the save alone), each save a new
step of one run through one ``Checkpointer`` (as a trainer keeps one, so the
trail's head stays cached after the first save; a warm-up save of each size
is not counted). The table gives the median save time of each and their
difference, which is the trail's two create-only record writes (the intent
before the manifest, the outcome after it) plus, on the first save of a
process, one listing of the trail. A last row times those two records alone
(``audited`` around nothing), the trail's floor on this disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import mouthguard
from benchmarks.state import build_state, parse_size, size_label
from mouthguard.checkpoint.audit import ENV_SWITCH, audited
from mouthguard.tiers.local import LocalTier


def _save_seconds(
    ckpt: mouthguard.Checkpointer, state: dict[str, torch.Tensor], step: int, *, trail: bool
) -> float:
    os.environ[ENV_SWITCH] = "on" if trail else "off"
    started = time.perf_counter()
    ckpt.save(step, state)
    return time.perf_counter() - started


def _checkpointer(root: Path) -> mouthguard.Checkpointer:
    """One store for the whole measurement, as a trainer keeps one: the trail's head is cached."""
    store = mouthguard.Store([LocalTier(root, name="fast", domain="a")])
    ckpt = mouthguard.Checkpointer(store, "bench", background=False)
    ckpt.manifest_keys = None
    return ckpt


def _records_seconds(root: Path, rounds: int) -> float:
    os.environ[ENV_SWITCH] = "on"
    tier = LocalTier(root, name="fast", domain="a")
    with audited("hold", "bench", 0, [tier], "warm-up"):
        pass
    times = []
    for i in range(rounds):
        started = time.perf_counter()
        with audited("hold", "bench", i, [tier], "benchmark"):
            pass
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    """Measure and print a markdown table (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1K,64M,256M")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args()
    print("| state | saves | median save, trail on | median save, trail off | difference |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        ckpt = _checkpointer(root)
        step = 0
        for text in args.sizes.split(","):
            size = parse_size(text)
            state = build_state(size) if size >= 1 << 20 else {"w": torch.ones(size // 4)}
            step += 1
            _save_seconds(ckpt, state, step, trail=True)  # warm-up: page cache, trail head
            on: list[float] = []
            off: list[float] = []
            for r in range(args.rounds):
                for trail in (r % 2 == 0, r % 2 != 0):
                    step += 1
                    (on if trail else off).append(_save_seconds(ckpt, state, step, trail=trail))
            a, b = statistics.median(on), statistics.median(off)
            print(
                f"| {size_label(size)} | {args.rounds} + {args.rounds} | {a * 1e3:.2f} ms "
                f"| {b * 1e3:.2f} ms | {(a - b) * 1e3:+.2f} ms ({(a - b) / b:+.1%}) |"
            )
        floor = _records_seconds(root / "records", 50)
        print(f"| the two records alone (intent + outcome) | 50 | {floor * 1e3:.2f} ms | | |")


if __name__ == "__main__":
    main()
