"""TrainingState: save -> load -> continue is bitwise identical to never stopping."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import mouthguard
from mouthguard.errors import StateMismatchError


def _build(seed: int = 0) -> mouthguard.TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return mouthguard.TrainingState(model, opt, sched, metadata={"best": float("inf")})


def _train(ts: mouthguard.TrainingState, steps: int) -> list[float]:
    """A loop that draws from every RNG: torch (data, dropout), numpy and python."""
    assert ts.optimizer is not None and ts.scheduler is not None
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8)
        noise = float(np.random.normal()) * 0.01 + random.random() * 0.01
        y = x.sum(dim=1, keepdim=True) + noise
        loss = torch.nn.functional.mse_loss(ts.model(x), y)  # type: ignore[operator]
        ts.optimizer.zero_grad()  # type: ignore[attr-defined]
        loss.backward()
        ts.optimizer.step()  # type: ignore[attr-defined]
        ts.scheduler.step()  # type: ignore[attr-defined]
        ts.step += 1
        ts.metadata["best"] = min(float(ts.metadata["best"]), loss.item())  # type: ignore[arg-type]
        losses.append(loss.item())
    return losses


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("in_place", [False, True])
def test_resume_is_bitwise_identical(ckpt: mouthguard.Checkpointer, in_place: bool) -> None:
    _seed_all(7)
    reference = _build()
    _seed_all(7)
    ref_losses = _train(reference, 10)

    _seed_all(7)
    interrupted = _build()
    _seed_all(7)
    first = _train(interrupted, 4)
    ckpt.save(interrupted.step, interrupted.state_dict())
    # Scramble everything a crash would lose: fresh process state, other RNG draws.
    _seed_all(999)
    resumed = _build(seed=123)
    target = resumed.state_dict() if in_place else None
    loaded = ckpt.load(into=target)
    assert isinstance(loaded.state, dict)
    resumed.load_state_dict(loaded.state)
    assert resumed.step == 4
    rest = _train(resumed, 6)

    assert [x.hex() for x in first + rest] == [x.hex() for x in ref_losses]
    for (name, a), b in zip(
        reference.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.metadata == reference.metadata
    assert reference.scheduler is not None and resumed.scheduler is not None
    assert resumed.scheduler.state_dict() == reference.scheduler.state_dict()


def test_missing_parts_are_clear(ckpt: mouthguard.Checkpointer) -> None:
    ts = _build()
    ckpt.save(1, {"step": 1, "model": ts.model.state_dict(), "rng": mouthguard.capture_rng_state()})
    loaded = ckpt.load().state
    assert isinstance(loaded, dict)
    with pytest.raises(StateMismatchError, match="optimizer"):
        ts.load_state_dict(loaded)


def test_rng_state_round_trips_through_a_checkpoint(ckpt: mouthguard.Checkpointer) -> None:
    _seed_all(3)
    ckpt.save(1, {"rng": mouthguard.capture_rng_state()})
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    _seed_all(4)
    loaded = ckpt.load().state
    assert isinstance(loaded, dict)
    mouthguard.restore_rng_state(loaded["rng"])
    got = (random.random(), float(np.random.rand()), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_malformed_rng_state_is_clear() -> None:
    with pytest.raises(StateMismatchError, match="RNG"):
        mouthguard.restore_rng_state({"python": 3})
