"""TrainingState carries the loader's position into the checkpoint; a changed dataset is
refused on restore (both fingerprints named) before anything is touched, unless forced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.data import StreamingDataLoader, StreamingDataset
from mouthguard.errors import DatasetChangedError, StateMismatchError

from .helpers import sample, write_dataset

N = 30


def _loader(path: Path) -> StreamingDataLoader:
    return StreamingDataLoader(StreamingDataset(path, shuffle=True, seed=4, batch_size=3))


def _keys(loader: StreamingDataLoader, batches: int | None = None) -> list[str]:
    out: list[str] = []
    for number, batch in enumerate(loader):
        out += batch["__key__"]
        if batches is not None and number + 1 == batches:
            break
    return out


def _training(loader: StreamingDataLoader, fill: float) -> mouthguard.TrainingState:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(fill)
    return mouthguard.TrainingState(model, data=loader)


def test_resume_from_a_checkpoint_continues_the_data_exactly(
    tmp_path: Path, ckpt: mouthguard.Checkpointer
) -> None:
    write_dataset(tmp_path, n=N)
    whole = _keys(_loader(tmp_path / "ds"))
    loader = _loader(tmp_path / "ds")
    head = _keys(loader, 4)
    ckpt.save(1, _training(loader, 1.0).state_dict())

    fresh = _loader(tmp_path / "ds")
    training = _training(fresh, 0.0)
    training.load_state_dict(ckpt.load().state)
    assert (fresh.epoch, fresh.consumed) == (0, 12)
    assert head + _keys(fresh) == whole
    assert torch.equal(training.model.weight, torch.full((2, 2), 1.0))  # type: ignore[attr-defined]


def test_a_changed_dataset_is_refused_and_nothing_is_restored(
    tmp_path: Path, ckpt: mouthguard.Checkpointer
) -> None:
    write_dataset(tmp_path / "v1", n=N)
    write_dataset(tmp_path / "v2", samples=[sample(i) for i in range(N + 3)])
    loader = _loader(tmp_path / "v1" / "ds")
    _keys(loader, 2)
    ckpt.save(1, _training(loader, 1.0).state_dict())

    other = _loader(tmp_path / "v2" / "ds")
    training = _training(other, 0.0)
    state = ckpt.load().state
    with pytest.raises(DatasetChangedError) as caught:
        training.load_state_dict(state)
    message = str(caught.value)
    assert loader.state_dict()["fingerprint"] in message
    assert other.state_dict()["fingerprint"] in message
    assert "force_data=True" in message  # the keyword this method takes, not the loader's
    assert torch.equal(training.model.weight, torch.zeros(2, 2))  # type: ignore[attr-defined]
    assert (other.epoch, other.consumed) == (0, 0)

    training.load_state_dict(state, force_data=True)  # the documented way past it
    assert (other.epoch, other.consumed) == (0, 6)
    assert torch.equal(training.model.weight, torch.ones(2, 2))  # type: ignore[attr-defined]


def test_a_checkpoint_without_a_data_position_is_a_mismatch(
    tmp_path: Path, ckpt: mouthguard.Checkpointer
) -> None:
    write_dataset(tmp_path, n=N)
    ckpt.save(1, mouthguard.TrainingState(torch.nn.Linear(2, 2)).state_dict())
    training = _training(_loader(tmp_path / "ds"), 0.0)
    with pytest.raises(StateMismatchError, match="data"):
        training.load_state_dict(ckpt.load().state)
