"""What ``mouthguard demo`` says it left on disk."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import mouthguard
from mouthguard.cli.demo_summary import disk_use


def test_the_run_s_bytes_include_its_diverged_sibling(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    for run, n in (("demo-1", 1 << 16), ("demo-1-diverged", 1 << 18), ("other", 1 << 12)):
        mouthguard.Checkpointer(store, run, background=False).save(1, {"w": torch.ones(n)})
    report: Any = SimpleNamespace(
        store=tmp_path / "store", run="demo-1", diverged=SimpleNamespace(run="demo-1-diverged")
    )
    with_sibling = disk_use(report)
    report.diverged = None
    alone = disk_use(report)
    assert with_sibling.run_bytes - alone.run_bytes >= 4 * (1 << 18)  # the sibling's floats
    assert alone.store_bytes == with_sibling.store_bytes > with_sibling.run_bytes
