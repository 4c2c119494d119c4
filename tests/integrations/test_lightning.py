"""The Lightning CheckpointIO with a real Lightning Trainer (tiny model, CPU, no download)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef, mark_suspect
from mouthguard.checkpoint.writer import utc_now
from mouthguard.cli.main import main
from mouthguard.errors import CheckpointFallbackWarning, FormatError, UnsupportedStateError
from mouthguard.integrations.lightning import (
    CheckpointIO,
    load_from_checkpoint,
    restore_pointers,
)
from mouthguard.integrations.pointer import read_pointer
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.throttle import ThrottledTier
from tests.checkpoint.helpers import assert_same, flip_byte, step_path

pytestmark = pytest.mark.filterwarnings(
    # Lightning's own advice (workers, logging intervals) is not what these tests are about.
    "ignore::UserWarning:lightning",
    "ignore::DeprecationWarning",
)


class Tiny(L.LightningModule):
    def __init__(self, lr: float = 0.1, extra: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, _index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, _index: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def _data() -> tuple[DataLoader[Any], DataLoader[Any]]:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    return DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=8)


def _trainer(root: Path, epochs: int, io: CheckpointIO | None, **ckpt_args: Any) -> L.Trainer:
    callbacks = [ModelCheckpoint(monitor="val_loss", save_last=True, **ckpt_args)] if io else []
    return L.Trainer(
        max_epochs=epochs,
        plugins=[io] if io else None,
        callbacks=callbacks,
        enable_checkpointing=io is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=root,
    )


def _fit(root: Path, epochs: int, io: CheckpointIO | None, seed: int = 0, **kw: Any) -> Tiny:
    torch.manual_seed(seed)
    model = Tiny()
    train, val = _data()
    _trainer(root, epochs, io).fit(model, train, val, **kw)
    return model


@pytest.fixture
def io(store: mouthguard.Store) -> CheckpointIO:
    return CheckpointIO(store, run="lit", background=False)


def test_resume_from_the_store_ends_equal_to_an_uninterrupted_run(
    tmp_path: Path, io: CheckpointIO
) -> None:
    reference = _fit(tmp_path / "ref", 2, None)
    _fit(tmp_path / "run", 1, io)  # interrupted after epoch 1
    directory = tmp_path / "run" / "checkpoints"
    saved = {p.name: read_pointer(p) for p in directory.iterdir()}
    shutil.rmtree(directory)  # ... and the machine with its checkpoint directory is gone
    restored = restore_pointers(io.checkpointer.store, "lit", directory)
    assert {p.name: read_pointer(p) for p in restored} == saved
    # A new model with other initial weights: only the checkpoint can make it match.
    resumed = _fit(tmp_path / "run", 2, io, seed=1, ckpt_path="last")
    assert torch.equal(resumed.layer.weight, reference.layer.weight)
    assert torch.equal(resumed.layer.bias, reference.layer.bias)
    # The bytes are in the store; the checkpoint directory holds pointers only.
    for path in (tmp_path / "run" / "checkpoints").iterdir():
        assert path.stat().st_size < 200
        assert io.checkpointer.info(read_pointer(path).step) is not None


def test_load_returns_the_dict_that_was_saved(tmp_path: Path, io: CheckpointIO) -> None:
    saved = {
        "epoch": 3,
        "global_step": 12,
        "state_dict": {"layer.weight": torch.randn(2, 3), "layer.bias": torch.zeros(2)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []}],
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 3}}}},
        "hyper_parameters": {"lr": 0.1, "betas": (0.9, 0.99), "name": None},
        "pytorch-lightning_version": "2.6.6",
    }
    path = tmp_path / "ckpts" / "epoch=3-step=12.ckpt"
    io.save_checkpoint(saved, path)
    assert_same(io.load_checkpoint(path), saved)
    io.teardown()


def test_importance_follows_the_rule(tmp_path: Path, io: CheckpointIO) -> None:
    torch.manual_seed(0)
    model = Tiny()
    train, val = _data()
    every3 = ModelCheckpoint(every_n_train_steps=3, save_top_k=-1, filename="s{step}")
    trainer = _trainer(tmp_path, 2, io)
    trainer.callbacks.append(every3)  # type: ignore[attr-defined]
    trainer.fit(model, train, val)
    best = trainer.checkpoint_callback
    assert isinstance(best, ModelCheckpoint)

    def level(name: str) -> str:
        info = io.checkpointer.info(read_pointer(tmp_path / "checkpoints" / name).step)
        assert info is not None
        return info.importance.value

    assert Path(best.best_model_path).name == "epoch=1-step=8.ckpt"
    assert level("epoch=1-step=8.ckpt") == "critical"  # the monitored best
    assert level("last.ckpt") == "routine"  # milestones only where asked for
    assert level("sstep=3.ckpt") == "routine"  # mid-epoch
    assert level("sstep=6.ckpt") == "routine"
    # The first epoch's best (step 4) was superseded: demoted, then given up by top-k.
    old_best = io.checkpointer.info(4)
    assert old_best is not None
    assert (old_best.saved_importance, old_best.importance.value) == ("critical", "routine")
    assert old_best.state == "trashed"
    # last.ckpt was saved again at epoch 2: the checkpoint it named before is trashed too.
    first_last = io.checkpointer.info(5)
    assert first_last is not None and first_last.state == "trashed"
    assert read_pointer(tmp_path / "checkpoints" / "last.ckpt").step == 9
    assert not (tmp_path / "checkpoints" / "epoch=0-step=4.ckpt").exists()


def test_a_callable_or_storage_options_override_the_rule(tmp_path: Path, store: Any) -> None:
    io = CheckpointIO(store, run="lit", importance=lambda ckpt, path: "transient", background=False)
    state = {"global_step": 1, "state_dict": {"w": torch.ones(2)}}
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    io.save_checkpoint(state, tmp_path / "b.ckpt", storage_options={"importance": "golden"})
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint(state, tmp_path / "c.ckpt", storage_options={"compress": True})
    io.teardown()
    levels = [i.importance.value for i in io.checkpointer.list()]
    assert levels == ["transient", "critical"]


def test_remove_trashes_but_never_a_held_or_critical_checkpoint(
    tmp_path: Path, io: CheckpointIO
) -> None:
    paths = [tmp_path / f"{name}.ckpt" for name in ("plain", "held", "best")]
    for number, path in enumerate(paths):
        options = {"importance": "critical"} if path.stem == "best" else None
        io.save_checkpoint({"global_step": number, "w": torch.ones(3)}, path, options)
    io.saves.settle()
    held = read_pointer(paths[1]).step
    io.checkpointer.hold(held, "release-candidate")
    for path in paths:
        io.remove_checkpoint(path)
        assert not path.exists()
    states = {i.step: i.state for i in io.checkpointer.list()}
    assert states[0] == "trashed"
    assert states[held] != "trashed"
    assert states[2] != "trashed"
    io.remove_checkpoint(paths[0])  # removing what is gone is not an error
    io.teardown()


def test_a_damaged_checkpoint_makes_the_resume_fall_back(
    tmp_path: Path, io: CheckpointIO, store: mouthguard.Store
) -> None:
    reference = _fit(tmp_path / "ref", 2, None)
    _fit(tmp_path / "run", 1, io)
    last = read_pointer(tmp_path / "run" / "checkpoints" / "last.ckpt").step
    flip_byte(step_path(store, "lit", last) / "rank-00000.safetensors", -1)
    with pytest.warns(CheckpointFallbackWarning) as warned:
        resumed = _fit(tmp_path / "run", 2, io, seed=1, ckpt_path="last")
    assert any(f"falling back to step {last - 1}" in str(w.message) for w in warned)
    # The fallback, the epoch's top-k file, holds the same training state.
    assert torch.equal(resumed.layer.weight, reference.layer.weight)


def test_a_suspect_checkpoint_makes_the_resume_fall_back(
    tmp_path: Path, io: CheckpointIO, store: mouthguard.Store
) -> None:
    """A checkpoint marked suspect (its state failed a check) is never resumed from."""
    reference = _fit(tmp_path / "ref", 2, None)
    _fit(tmp_path / "run", 1, io)
    last = read_pointer(tmp_path / "run" / "checkpoints" / "last.ckpt").step
    mark_suspect(CopyRef(store.fast, "lit", last), "loss diverged", utc_now())
    with pytest.warns(CheckpointFallbackWarning) as warned:
        resumed = _fit(tmp_path / "run", 2, io, seed=1, ckpt_path="last")
    assert any(
        f"falling back to step {last - 1}" in str(w.message) and "loss diverged" in str(w.message)
        for w in warned
    )
    assert torch.equal(resumed.layer.weight, reference.layer.weight)


def test_an_object_that_needs_pickle_is_named_and_nothing_is_saved(
    tmp_path: Path, io: CheckpointIO
) -> None:
    torch.manual_seed(0)
    model = Tiny(extra=object())
    train, val = _data()
    with pytest.raises(
        UnsupportedStateError, match=r"\['hyper_parameters'\]\['extra'\].*on_save_checkpoint"
    ):
        _trainer(tmp_path, 1, io).fit(model, train, val)
    assert io.checkpointer.steps() == []
    assert not list((tmp_path / "checkpoints").glob("*.ckpt"))


def test_a_failed_background_save_is_raised_at_teardown(tmp_path: Path, io: CheckpointIO) -> None:
    io.save_checkpoint({"global_step": 5, "w": torch.ones(2)}, tmp_path / "a.ckpt")
    io.saves.settle()
    # Another writer takes the step the next save will get: its commit must fail.
    mouthguard.Checkpointer(io.checkpointer.store, "lit", background=False).save(6, {"x": 1})
    io.save_checkpoint({"global_step": 5, "w": torch.ones(2)}, tmp_path / "b.ckpt")
    with pytest.raises(mouthguard.MouthguardError, match="step 6"):
        io.teardown()
    io.teardown()  # reported once, not again


def test_a_file_that_is_not_a_pointer_is_refused(tmp_path: Path, io: CheckpointIO) -> None:
    path = tmp_path / "old.ckpt"
    torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(FormatError, match="not a mouthguard checkpoint pointer"):
        io.load_checkpoint(path)
    io.remove_checkpoint(path)  # top-k dropping a file from before the switch: deleted
    assert not path.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(mouthguard.MouthguardError, match="no checkpoint at"):
            io.load_checkpoint(tmp_path / "missing.ckpt")


def test_save_top_k_bounds_what_the_store_keeps_after_gc(
    tmp_path: Path, io: CheckpointIO, store: mouthguard.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented ``ModelCheckpoint(monitor=..., save_top_k=2, save_last=True)``: after a
    retention pass, the store keeps what Lightning keeps, and the rest stays in the trash."""
    torch.manual_seed(0)
    model = Tiny()
    train, val = _data()
    _trainer(tmp_path, 6, io, save_top_k=2).fit(model, train, val)
    io.teardown()
    kept_by_lightning = {read_pointer(p).step for p in (tmp_path / "checkpoints").glob("*.ckpt")}
    assert len(kept_by_lightning) <= 3  # the top 2 and last (which may be one of them)
    assert main(["--store", str(store.source), "gc", "--apply"]) == 0
    capsys.readouterr()
    live = {i.step for i in io.checkpointer.list() if i.state != "trashed"}
    assert live == kept_by_lightning


def test_a_supersede_left_undone_by_a_killed_run_is_finished_on_the_next_start(
    tmp_path: Path, store: mouthguard.Store
) -> None:
    killed = CheckpointIO(store, run="lit", background=False)
    state = {"global_step": 1, "state_dict": {"w": torch.ones(2)}}
    path = tmp_path / "checkpoints" / "last.ckpt"
    killed.save_checkpoint(state, path)
    killed.save_checkpoint({**state, "global_step": 2}, path)  # supersedes the first...
    killed.checkpointer.flush()  # ...committed, but the run dies before giving it up
    first, second = killed.checkpointer.steps()
    assert killed.checkpointer.info(first).state != "trashed"  # type: ignore[union-attr]
    restarted = CheckpointIO(store, run="lit", background=False)
    assert restarted.load_checkpoint(path)["global_step"] == 2
    assert restarted.checkpointer.info(first).state == "trashed"  # type: ignore[union-attr]
    assert restarted.checkpointer.info(second).state != "trashed"  # type: ignore[union-attr]
    # A pointer that is merely missing (a lost directory) proves nothing: nothing is given up.
    path.unlink()
    again = CheckpointIO(store, run="lit", background=False)
    again.save_checkpoint({**state, "global_step": 3}, tmp_path / "checkpoints" / "other.ckpt")
    again.teardown()
    assert again.checkpointer.info(second).state != "trashed"  # type: ignore[union-attr]


def test_a_second_checkpoint_io_sees_a_save_still_in_flight(tmp_path: Path) -> None:
    """``trainer.save_checkpoint(p)``, then a new Trainer's ``fit(ckpt_path=p)``: the new
    plug-in waits for the first one's save instead of falling back past it."""
    # A slow disk (256 KiB/s for a 256 KiB state): the save is still being written
    # when the second plug-in reads the pointer.
    slow = ThrottledTier(LocalTier(tmp_path / "fast"), write_bytes_per_second=256 * 1024)
    store = mouthguard.Store([slow])
    first = CheckpointIO(store, run="lit", background=False)
    path = tmp_path / "checkpoints" / "manual.ckpt"
    first.save_checkpoint({"global_step": 1, "state_dict": {"w": torch.zeros(4)}}, path)
    big = {"global_step": 7, "state_dict": {"w": torch.ones(64 * 1024)}}
    first.save_checkpoint(big, path)  # returns once snapshotted; the write goes on
    second = CheckpointIO(store, run="lit", background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointFallbackWarning)
        loaded = second.load_checkpoint(path)
    assert loaded["global_step"] == 7
    first.teardown()


def test_a_module_loads_from_a_pointer(
    tmp_path: Path, io: CheckpointIO, store: mouthguard.Store
) -> None:
    """``Model.load_from_checkpoint(pointer)`` cannot read a pointer; the helper can."""
    trained = _fit(tmp_path, 1, io)
    path = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(Exception, match=r"(?i)unpickl|load key"):
        Tiny.load_from_checkpoint(path)  # Lightning's own: the limitation documented
    loaded = load_from_checkpoint(Tiny, store, path)
    assert isinstance(loaded, Tiny) and loaded.hparams["lr"] == 0.1
    assert torch.equal(loaded.layer.weight, trained.layer.weight)
    assert load_from_checkpoint(Tiny, store, path, lr=0.5).hparams["lr"] == 0.5
