"""A checkpoint saved by two real gloo ranks, each holding a tensor named ``w``."""

from __future__ import annotations

from pathlib import Path

import torch

import mouthguard
from tests.distributed import run_distributed


def _save(rank: int, _world_size: int, root: str) -> int:
    ckpt = mouthguard.Checkpointer(root, run="tp", background=False)
    ckpt.save(1, {"w": torch.full((4,), float(rank))})
    return rank


def save_two_ranks(root: Path) -> Path:
    """Save step 1 of run ``tp`` from two ranks into the store at ``root``; return it."""
    mouthguard.open_store(root)  # created once, before the ranks race to create it
    run_distributed(_save, 2, str(root))
    return root
