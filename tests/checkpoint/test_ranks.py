"""The rank group's collective timeout: finite by default, and handed to the process group."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import mouthguard
from mouthguard.checkpoint.ranks import COLLECTIVE_TIMEOUT, TorchRanks
from mouthguard.errors import RankLostError


@pytest.fixture
def new_group_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Pretend a 2-rank job is running; record every ``new_group`` call instead of making one."""
    calls: list[dict[str, Any]] = []

    def new_group(**kw: Any) -> object:
        calls.append(kw)
        return object()

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda _group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda _group=None: 0)
    monkeypatch.setattr(dist, "new_group", new_group)
    return calls


def test_the_default_timeout_is_finite_and_reaches_the_process_group(
    tmp_path: Path, new_group_calls: list[dict[str, Any]]
) -> None:
    ckpt = mouthguard.Checkpointer(tmp_path / "store", "r", background=False)
    assert isinstance(ckpt.ranks, TorchRanks)
    (call,) = new_group_calls
    assert call["backend"] == "gloo"
    # The documented default (300 s): a dead or stopped rank is given up on after it.
    assert call["timeout"] == COLLECTIVE_TIMEOUT == dt.timedelta(seconds=300)
    assert ckpt.ranks.timeout == call["timeout"]


def test_a_chosen_timeout_reaches_the_process_group(
    tmp_path: Path, new_group_calls: list[dict[str, Any]]
) -> None:
    mouthguard.Checkpointer(tmp_path / "store", "r", background=False, collective_timeout=7.5)
    (call,) = new_group_calls
    assert call["timeout"] == dt.timedelta(seconds=7.5)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_timeout_that_is_not_positive_is_refused(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="collective_timeout"):
        mouthguard.Checkpointer(tmp_path / "store", "r", background=False, collective_timeout=bad)


def test_the_lost_rank_message_names_the_timeout(new_group_calls: list[dict[str, Any]]) -> None:
    group = TorchRanks(timeout=dt.timedelta(seconds=3))

    def timed_out(*_args: object, **_kw: object) -> None:
        raise RuntimeError("Timed out waiting 3000ms for recv operation to complete")

    group._all_gather = timed_out  # type: ignore[method-assign]
    with pytest.raises(RankLostError, match="within 3 s"):
        group.all_gather("x")
