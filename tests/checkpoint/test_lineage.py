"""Lineage: each checkpoint names what it came from; ``show`` walks the chain back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.lineage import chain, dataset_position
from mouthguard.cli.main import main
from mouthguard.data import StreamingDataLoader, StreamingDataset
from mouthguard.errors import ManifestError
from mouthguard.format.lineage import Lineage, Origin
from mouthguard.format.manifest import Manifest
from tests.data.helpers import write_dataset


def _training(path: Path) -> tuple[mouthguard.TrainingState, StreamingDataLoader]:
    loader = StreamingDataLoader(StreamingDataset(path, shuffle=True, seed=4, batch_size=3))
    return mouthguard.TrainingState(torch.nn.Linear(2, 2), data=loader), loader


def _advance(loader: StreamingDataLoader, batches: int) -> None:
    for number, _ in enumerate(loader):
        if number + 1 == batches:
            return


def _lineage(store: mouthguard.Store, step: int) -> Lineage:
    raw = store.fast.get(f"r/{step:012d}/manifest.json")
    lineage = Manifest.from_bytes(raw).lineage
    assert lineage is not None
    return lineage


def test_lineage_across_two_resumes(
    tmp_path: Path, store: mouthguard.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path, n=30)
    data = tmp_path / "ds"
    # First process: steps 1 and 2.
    first = mouthguard.Checkpointer(store, "r", background=False)
    training, loader = _training(data)
    for step in (1, 2):
        _advance(loader, 1)
        first.save(step, training.state_dict())
    fingerprint = loader.state_dict()["fingerprint"]
    # Second process: resumes from 2, saves 3 and 4.
    second = mouthguard.Checkpointer(store, "r", background=False)
    training, loader = _training(data)
    training.load_state_dict(second.load().state)
    for step in (3, 4):
        _advance(loader, 1)
        second.save(step, training.state_dict())
    # Third process: resumes from 3 (4 judged bad), saves 5.
    third = mouthguard.Checkpointer(store, "r", background=False)
    training, loader = _training(data)
    training.load_state_dict(third.load(at_or_before=3).state)
    _advance(loader, 1)
    third.save(5, training.state_dict())

    assert _lineage(store, 1).parent is None and _lineage(store, 1).resumed_from is None
    assert _lineage(store, 2).parent == Origin("r", 1)
    three, four, five = (_lineage(store, s) for s in (3, 4, 5))
    assert three.parent is not None and (three.parent.run, three.parent.step) == ("r", 2)
    assert three.resumed_from == three.parent and three.resumed_from.created is not None
    assert four.parent == Origin("r", 3) and four.resumed_from == three.resumed_from
    assert five.resumed_from is not None and five.resumed_from.step == 3
    # The dataset fingerprint travels with the loader position it belongs to.
    positions = [_lineage(store, s).dataset for s in (1, 2, 3, 4, 5)]
    assert all(p is not None and p.fingerprint == fingerprint for p in positions)
    assert [p.consumed for p in positions if p is not None] == [3, 6, 9, 12, 12]
    assert all(p is not None and p.key == "data" for p in positions)

    assert [link.origin.step for link in chain(store, "r", 5)] == [5, 3, 2, 1]
    capsys.readouterr()
    assert main(["--store", store.source, "show", "r", "5"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("lineage (newest first):") :].splitlines()
    assert lines[1].strip().startswith("r step 5: resumed from r step 3; data ")
    assert lines[2].startswith("  <- r step 3: resumed from r step 2")
    assert lines[3].startswith("  <- r step 2: data ")
    assert lines[4].startswith("  <- r step 1: data ") and "first checkpoint" in lines[4]
    assert main(["--store", store.source, "show", "r", "4", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [x["step"] for x in body["lineage"]] == [4, 3, 2, 1]
    assert body["lineage"][1]["resumed_from"]["step"] == 2

    # A deleted ancestor ends the chain with the reason.
    for tier in store.tiers:
        shutil.rmtree(Path(tier.location("r/000000000002/")), ignore_errors=True)
    links = chain(store, "r", 5)
    assert [x.origin.step for x in links] == [5, 3, 2]
    assert "not in the store" in links[-1].missing


def test_a_save_without_a_loader_or_a_resume_records_only_its_parent(
    ckpt: mouthguard.Checkpointer,
) -> None:
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.save(2, {"w": torch.ones(2)})
    first = Manifest.from_bytes(ckpt.store.fast.get("r/000000000001/manifest.json"))
    assert first.lineage is None  # nothing to say: the manifest is as it always was
    assert _lineage(ckpt.store, 2) == Lineage(parent=Origin("r", 1))


def test_dataset_position_is_recognised_by_shape() -> None:
    position = {"fingerprint": "abc", "epoch": 0, "consumed": 5}
    found = dataset_position({"model": {}, "loader": position})
    assert found is not None and (found.key, found.consumed) == ("loader", 5)
    assert dataset_position(position) is not None
    assert dataset_position({"x": {"fingerprint": "abc", "epoch": True, "consumed": 1}}) is None
    assert dataset_position([position]) is None


def test_a_malformed_lineage_is_a_clear_manifest_error(ckpt: mouthguard.Checkpointer) -> None:
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.save(2, {"w": torch.ones(2)})
    manifest = Manifest.from_bytes(ckpt.store.fast.get("r/000000000002/manifest.json"))
    body = json.loads(manifest.to_bytes())
    body["lineage"]["parent"]["step"] = -1
    body.pop("manifest_checksum")
    from mouthguard.format.sealed import seal  # noqa: PLC0415 - the test forges a document

    with pytest.raises(ManifestError, match=r"lineage\.parent"):
        Manifest.from_bytes(seal(body))
