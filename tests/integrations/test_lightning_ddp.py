"""The Lightning plug-in under DDP: two real gloo processes, only rank 0 writes, resume is exact."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from tests.distributed import run_distributed

pytestmark = pytest.mark.slow


def _fit_ddp(
    rank: int, world_size: int, root: str, epochs: int, seed: int, plugin: bool, resume: bool
) -> dict[str, list[float]]:
    # Lightning joins the process group run_distributed already set up: it reads the
    # ranks from the environment and skips its own rendezvous.
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size))
    warnings.simplefilter("ignore")
    import lightning as L  # noqa: PLC0415 - in the child only
    from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: PLC0415

    from mouthguard.integrations.lightning import CheckpointIO  # noqa: PLC0415
    from tests.integrations.test_lightning import Tiny, _data  # noqa: PLC0415

    io = CheckpointIO(Path(root) / "store", run="ddp", background=False) if plugin else None
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy="ddp",
        max_epochs=epochs,
        plugins=[io] if io else None,
        callbacks=[ModelCheckpoint(monitor="val_loss", save_last=True)] if io else [],
        enable_checkpointing=io is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=Path(root) / ("run" if plugin else "ref"),
    )
    torch.manual_seed(seed)
    model = Tiny()
    train, val = _data()
    trainer.fit(model, train, val, ckpt_path="last" if resume else None)
    steps = io.checkpointer.steps() if io else []
    return {
        "weight": model.layer.weight.flatten().tolist(),
        "steps": [float(s) for s in steps],
    }


def _reference_then_interrupted(
    rank: int, world_size: int, root: str
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Two fits in one launch (each launch imports torch and Lightning anew: seconds)."""
    reference = _fit_ddp(rank, world_size, root, 2, 0, False, False)
    return reference, _fit_ddp(rank, world_size, root, 1, 0, True, False)


def test_ddp_resume_from_the_store_matches_an_uninterrupted_ddp_run(tmp_path: Path) -> None:
    root = str(tmp_path)
    (reference, first), _ = run_distributed(_reference_then_interrupted, 2, root)
    assert first["steps"] == [2.0, 3.0]  # rank 0 alone wrote: the top-k file and last.ckpt
    resumed = run_distributed(_fit_ddp, 2, root, 2, 1, True, True)
    assert resumed[0]["weight"] == resumed[1]["weight"] == reference["weight"]
