"""The integrations' parts on their own: pointer files, directories as state, numbering."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.errors import CheckpointExistsError, CheckpointNotFoundError, FormatError
from mouthguard.integrations.dir_files import read_dir, write_dir
from mouthguard.integrations.pointer import (
    MAX_POINTER_BYTES,
    Pointer,
    read_pointer,
    remove_pointer,
    write_pointer,
)
from mouthguard.integrations.saves import TrainerSaves, as_rule
from mouthguard.policy.importance import Importance

# --- pointer files ---------------------------------------------------------------------


def test_a_pointer_round_trips_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "last.ckpt"
    write_pointer(path, Pointer("run-1", 7))
    write_pointer(path, Pointer("run-1", 9))
    assert read_pointer(path) == Pointer("run-1", 9)
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left
    assert remove_pointer(path)
    assert not remove_pointer(path)
    with pytest.raises(CheckpointNotFoundError):
        read_pointer(path)


@pytest.mark.parametrize(
    "content",
    [
        b"\x80\x02}q\x00.",  # a pickle
        b"{}",
        b'{"mouthguard_pointer": 2, "run": "r", "step": 1}',
        b'{"mouthguard_pointer": 1, "run": "../etc", "step": 1}',
        b'{"mouthguard_pointer": 1, "run": "r", "step": -1}',
        b'{"mouthguard_pointer": 1, "run": "r", "step": true}',
        b'{"mouthguard_pointer": 1, "run": "r", "step": 1, "step": 2}',
        b" " * (MAX_POINTER_BYTES + 1),
    ],
)
def test_anything_but_a_valid_pointer_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.ckpt"
    path.write_bytes(content)
    with pytest.raises(FormatError):
        read_pointer(path)


# --- directories as state ----------------------------------------------------------------


def test_a_directory_round_trips_byte_for_byte(tmp_path: Path) -> None:
    source = tmp_path / "checkpoint-4"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(bytes(range(256)) * 3)
    (source / "empty.txt").write_bytes(b"")
    (source / "sub" / "adapter.bin").write_bytes(b"\x00\x01")
    files = read_dir(source)
    assert sorted(files) == ["empty.txt", "model.safetensors", "sub/adapter.bin"]
    copy = write_dir(files, tmp_path / "out" / "checkpoint-4")
    for name in files:
        assert (copy / name).read_bytes() == (source / name).read_bytes()
    with pytest.raises(FileExistsError):
        write_dir(files, copy)


def test_links_are_refused_when_reading(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to(tmp_path)
    with pytest.raises(mouthguard.MouthguardError, match="regular files"):
        read_dir(tmp_path / "d")


@pytest.mark.parametrize("name", ["../escape", "/abs", "a//b", "a/", "", ".", "a/../b", "a\\b"])
def test_unsafe_stored_names_write_nothing(tmp_path: Path, name: str) -> None:
    files = {"fine.txt": torch.zeros(3, dtype=torch.uint8), name: torch.zeros(1, dtype=torch.uint8)}
    with pytest.raises(FormatError):
        write_dir(files, tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


def test_stored_files_must_be_byte_tensors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="uint8"):
        write_dir({"a": torch.zeros(2)}, tmp_path / "dest")
    with pytest.raises(FormatError):
        write_dir(["a"], tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


# --- numbering, errors and the best ----------------------------------------------------------


def test_steps_follow_the_global_step_and_always_grow(store: mouthguard.Store) -> None:
    saves = TrainerSaves(store, "r", background=False)
    numbered = [saves.submit(g, {"w": torch.ones(1)}, Importance.ROUTINE) for g in (4, 4, 8, 3)]
    saves.close()
    assert numbered == [4, 5, 8, 9]  # a repeated and an older global step get last + 1
    again = TrainerSaves(store, "r", background=False)  # a new process continues after 9
    assert again.next_step(2) == 10


def test_a_failed_save_is_raised_once_and_keeps_the_previous_best(
    store: mouthguard.Store,
) -> None:
    saves = TrainerSaves(store, "r", background=False)
    saves.submit(
        1, {"w": torch.ones(1)}, Importance.CRITICAL, best_of="val", otherwise=Importance.ROUTINE
    )
    saves.settle()
    mouthguard.Checkpointer(store, "r", background=False).save(2, {"taken": True})
    saves._last_step = 1  # as if the other writer were not seen: the next save collides
    saves.submit(2, {"w": torch.zeros(1)}, Importance.CRITICAL, best_of="val")
    with pytest.raises(CheckpointExistsError):
        saves.settle()
    assert saves.settle() is None  # raised once
    assert saves.checkpointer.info(1).importance is Importance.CRITICAL  # type: ignore[union-attr]
    saves.submit(3, {"w": torch.zeros(1)}, Importance.CRITICAL, best_of="val")
    saves.close()
    assert saves.checkpointer.info(1).importance is Importance.ROUTINE  # type: ignore[union-attr]
    assert saves.checkpointer.info(3).importance is Importance.CRITICAL  # type: ignore[union-attr]


def test_importance_rules() -> None:
    assert as_rule(None) is None
    assert as_rule("golden")(1, 2) is Importance.CRITICAL  # type: ignore[misc]
    with pytest.raises(ValueError):
        as_rule("precious")
