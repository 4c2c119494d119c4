"""The HF Trainer callback and restore, with a real Trainer (tiny GPT-2, CPU, no download)."""

from __future__ import annotations

import base64
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef, mark_suspect
from mouthguard.checkpoint.writer import utc_now
from mouthguard.errors import CheckpointFallbackWarning, UnsignedRestoreWarning
from mouthguard.format.signing import ENV_KEY
from mouthguard.integrations.hf import MouthguardCallback, restore
from tests.checkpoint.helpers import flip_byte, step_path

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

CONFIG = GPT2Config(
    n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, eos_token_id=0, bos_token_id=0,
)  # fmt: skip


def _data(rows: int = 16) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 32, (rows, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": r, "labels": r} for r in ids]


def _args(out: Path, epochs: int = 2, **extra: Any) -> TrainingArguments:
    return TrainingArguments(
        str(out), num_train_epochs=epochs, per_device_train_batch_size=4, save_strategy="epoch",
        report_to=[], use_cpu=True, disable_tqdm=True, seed=1, logging_strategy="no", **extra,
    )  # fmt: skip


class StopAfterEpoch1(TrainerCallback):
    """The interruption: training stops once epoch 1 is done (and checkpointed)."""

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.epoch >= 1:
            control.should_training_stop = True


def _model(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(CONFIG)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _callback(store: mouthguard.Store) -> MouthguardCallback:
    return MouthguardCallback(store, run="hf", background=False)


def test_a_restored_checkpoint_resumes_to_the_uninterrupted_result(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    reference = _model(0)
    Trainer(reference, _args(tmp_path / "ref"), train_dataset=_data()).train()

    out = tmp_path / "out"
    callback = _callback(store)
    Trainer(
        _model(0), _args(out), train_dataset=_data(), callbacks=[callback, StopAfterEpoch1()]
    ).train()
    original = {p.name: p.read_bytes() for p in (out / "checkpoint-4").iterdir()}
    shutil.rmtree(out)  # the local output directory is lost

    restored = restore(store, "hf", out)
    assert restored == out / "checkpoint-4"
    assert {p.name: p.read_bytes() for p in restored.iterdir()} == original  # byte for byte
    model = GPT2LMHeadModel.from_pretrained(restored)
    trainer = Trainer(model, _args(out), train_dataset=_data(), callbacks=[_callback(store)])
    trainer.train(resume_from_checkpoint=str(restored))
    for key, value in _weights(reference).items():
        assert torch.equal(model.state_dict()[key], value), key


def test_importance_follows_the_trainer_state(tmp_path: Path, store: mouthguard.Store) -> None:
    callback = _callback(store)
    args = _args(
        tmp_path, epochs=3, eval_strategy="epoch", metric_for_best_model="eval_loss",
        greater_is_better=True,  # the *worst* loss is "best": epoch 1 stays best, the rest are not
    )  # fmt: skip
    trainer = Trainer(
        _model(0), args, train_dataset=_data(), eval_dataset=_data(8), callbacks=[callback]
    )
    trainer.train()
    levels = {i.step: i.importance.value for i in callback.checkpointer.list()}
    best = int(Path(trainer.state.best_model_checkpoint).name.split("-")[1])
    final = trainer.state.global_step
    assert set(levels) == {4, 8, 12}
    assert levels[best] == "critical"
    for step, level in levels.items():
        if step != best:
            assert level == ("milestone" if step == final else "routine"), step


def test_the_previous_best_is_demoted_once_a_new_best_commits(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    callback = _callback(store)
    args = _args(tmp_path, eval_strategy="epoch", metric_for_best_model="eval_loss")
    trainer = Trainer(
        _model(0), args, train_dataset=_data(), eval_dataset=_data(8), callbacks=[callback]
    )
    trainer.train()
    infos = {i.step: i for i in callback.checkpointer.list()}
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-8")  # the loss went down
    assert (infos[4].saved_importance, infos[4].importance.value) == ("critical", "routine")
    assert infos[8].importance.value == "critical"


def test_restore_picks_the_previous_valid_checkpoint_when_the_newest_is_damaged(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    callback = _callback(store)
    Trainer(_model(0), _args(tmp_path / "out"), train_dataset=_data(), callbacks=[callback]).train()
    assert callback.checkpointer.steps() == [4, 8]
    flip_byte(step_path(store, "hf", 8) / "rank-00000.safetensors", -1)
    with pytest.warns(CheckpointFallbackWarning, match="step 8"):
        restored = restore(store, "hf", tmp_path / "again")
    assert restored.name == "checkpoint-4"
    expected = (tmp_path / "out" / "checkpoint-4" / "model.safetensors").read_bytes()
    assert (restored / "model.safetensors").read_bytes() == expected
    with pytest.raises(FileExistsError):
        restore(store, "hf", tmp_path / "again", step=4)


def test_restore_of_a_suspect_step_takes_the_valid_one_before(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    callback = _callback(store)
    Trainer(_model(0), _args(tmp_path / "out"), train_dataset=_data(), callbacks=[callback]).train()
    mark_suspect(CopyRef(store.fast, "hf", 8), "loss diverged", utc_now())
    with pytest.warns(CheckpointFallbackWarning, match="falling back to step 4"):
        restored = restore(store, "hf", tmp_path / "again", step=8)
    assert restored.name == "checkpoint-4"


def test_restoring_pickles_from_an_unsigned_store_warns_and_a_signed_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)
    unsigned = mouthguard.open_store(tmp_path / "unsigned")
    Trainer(_model(0), _args(tmp_path / "a", epochs=1), train_dataset=_data(),
            callbacks=[_callback(unsigned)]).train()  # fmt: skip
    with pytest.warns(UnsignedRestoreWarning, match=r"unsigned store.*optimizer\.pt"):
        restore(unsigned, "hf", tmp_path / "ra")

    monkeypatch.setenv(ENV_KEY, "base64:" + base64.b64encode(bytes(range(32))).decode())
    signed = mouthguard.open_store(tmp_path / "signed")
    Trainer(_model(0), _args(tmp_path / "b", epochs=1), train_dataset=_data(),
            callbacks=[_callback(signed)]).train()  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsignedRestoreWarning)
        restore(signed, "hf", tmp_path / "rb")


def test_after_a_resume_the_next_best_demotes_the_best_from_before(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    args = _args(tmp_path, eval_strategy="epoch", metric_for_best_model="eval_loss")
    first = Trainer(
        _model(0), args, train_dataset=_data(), eval_dataset=_data(8), callbacks=[_callback(store)]
    )
    first.train()
    assert first.state.best_global_step == 8
    callback = _callback(store)  # a new process knows nothing but the store and the state
    args = _args(tmp_path, epochs=3, eval_strategy="epoch", metric_for_best_model="eval_loss")
    again = Trainer(
        _model(0), args, train_dataset=_data(), eval_dataset=_data(8), callbacks=[callback]
    )
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-8"))
    assert again.state.best_global_step == 12
    levels = {i.step: i.importance.value for i in callback.checkpointer.list()}
    assert levels == {4: "routine", 8: "routine", 12: "critical"}
