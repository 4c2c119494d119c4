"""A run mixing Checkpointer saves and DCP saves: each loader loads only its own kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.errors import StateMismatchError
from tests.dcp.helpers import save_one_rank


def test_checkpointer_load_skips_dcp_saves_and_refuses_them_by_step(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    ckpt.save(10, {"w": torch.ones(3)})
    save_one_rank(store, 20, {"w": torch.zeros(3)})
    assert ckpt.steps() == [10, 20]
    newest = ckpt.load()  # the DCP save at 20 is not a state this loader can resume from
    assert newest.step == 10
    assert newest.rejected == []
    with pytest.raises(StateMismatchError, match=r"mouthguard\.dcp\.Reader"):
        ckpt.load(20)
