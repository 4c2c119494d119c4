"""Regenerate docs/dashboard.png: a small store in every state, served and photographed.

    .venv/bin/python scripts/dashboard_screenshot.py [--out docs/dashboard.png]

Saves two runs (asynchronous saves of a 64 MiB state, so the timeline shows real
stalls and durations), replicates and verifies the older checkpoints, holds a
release candidate, damages one copy, serves the store on loopback and takes a
headless chromium screenshot of the page. Needs the serve extra and chromium.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.dashboard import DashboardThread, SnapshotCache, create_app
from mouthguard.jobs.replicator import Replicator

REPO = Path(__file__).resolve().parents[1]


def build(root: Path) -> mouthguard.Store:
    """The store photographed: two runs, every state (module docstring)."""
    store = mouthguard.open_store(root)
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(16)}  # 64 MiB
    sft = mouthguard.Checkpointer(store, "llama-8b-sft", background=False)
    for step in range(100, 401, 100):
        sft.save(step, {k: v[:256] for k, v in state.items()})
    pretrain = mouthguard.Checkpointer(store, "llama-8b-pretrain", background=False)
    for step in range(500, 6001, 500):
        level = "milestone" if step % 2000 == 0 else "routine"
        pretrain.save_async(step, state, importance=level).result()
    pretrain.set_importance(4000, "critical", reason="best eval loss")
    pretrain.hold(4000, "release-candidate", reason="rc1 for the eval team")
    Replicator(store).run_once()
    pretrain.save_async(6500, state).result()  # the newest: not replicated yet
    rank = root / "durable" / "llama-8b-sft" / f"{300:012d}" / "rank-00000.safetensors"
    raw = bytearray(rank.read_bytes())
    raw[-1] ^= 0xFF
    rank.write_bytes(bytes(raw))
    verify_and_record(CopyRef(store.tier("durable"), "llama-8b-sft", 300))
    return store


def main() -> int:
    """Build, serve, photograph; exit 2 without chromium."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium is not installed (scripts/install-system-deps.sh)", file=sys.stderr)
        return 2
    out = args.out.resolve()
    # A fixed, generic place: the page's header names the store's directory.
    tmp = Path(tempfile.gettempdir()) / "mouthguard-screenshot"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        store = build(tmp / "mouthguard-store")
        with DashboardThread(create_app(SnapshotCache(store))) as served:
            subprocess.run(  # noqa: S603 - the browser found on PATH, our own URL
                [
                    browser,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--user-data-dir={tmp / 'profile'}",
                    "--virtual-time-budget=20000",
                    "--window-size=1400,1500",
                    f"--screenshot={out}",
                    served.address.url + "/",
                ],
                check=True,
                capture_output=True,
                timeout=300,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
