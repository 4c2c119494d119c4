"""The rank group's collective timeout: finite by default, and handed to the process group."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import mouthguard
from mouthguard.checkpoint.ranks import COLLECTIVE_TIMEOUT, INLINE_BYTES, TorchRanks
from mouthguard.errors import RankLostError
from tests.distributed import run_distributed


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


def _gather_values(rank: int, world_size: int) -> dict[str, object]:
    """Gathers of values that fit the inline bytes, and of ones that do not."""
    ranks = TorchRanks()
    long_text = "é" * INLINE_BYTES  # 2 bytes each in UTF-8 JSON: twice the inline size
    return {
        "small": ranks.all_gather({"rank": rank, "none": None}),
        "one_long": ranks.all_gather(long_text if rank == 1 else rank),
        "exactly_inline": ranks.all_gather("x" * (INLINE_BYTES - 2)),  # quotes make it full
        "empty": ranks.all_gather(""),
        "broadcast": ranks.broadcast(["from", rank]),
    }


def test_all_gather_returns_every_value_whatever_its_length() -> None:
    got = run_distributed(_gather_values, 3)
    long_text = "é" * INLINE_BYTES
    for result in got:
        assert result["small"] == [{"rank": r, "none": None} for r in range(3)]
        assert result["one_long"] == [0, long_text, 2]
        assert result["exactly_inline"] == ["x" * (INLINE_BYTES - 2)] * 3
        assert result["empty"] == ["", "", ""]
        assert result["broadcast"] == ["from", 0]
