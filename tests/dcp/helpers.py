"""In-process helpers for the DCP tests (one rank, ``no_dist``: no processes to spawn)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from mouthguard.checkpoint.store import Store
from mouthguard.dcp import Reader, Writer


def save_one_rank(root: Path | Store, step: int, state: dict[str, Any], **options: Any) -> None:
    """``dcp.save`` in this process as a world of one (background replication off)."""
    options.setdefault("background", False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, storage_writer=Writer(root, run="r", step=step, **options), no_dist=True)


def load_one_rank(
    root: Path | Store, state: dict[str, Any], *, step: int | None = None, **options: Any
) -> Reader:
    """``dcp.load`` into ``state`` in this process (no resharding peers: one rank)."""
    reader = Reader(root, run="r", step=step, **options)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return reader


def failure_of(exc: CheckpointException) -> BaseException:
    """The single rank's exception inside DCP's CheckpointException."""
    (error, _trace), *rest = exc.failures.values()
    assert not rest
    return error


def zeros_like_state(state: dict[str, Any]) -> dict[str, Any]:
    """Same structure, tensors zeroed, plain values None (DCP replaces those wholesale)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out[key] = zeros_like_state(value)
        elif isinstance(value, torch.Tensor):
            out[key] = torch.zeros_like(value)
        else:
            out[key] = None
    return out
