"""Damage is never silent: a checkpoint damaged on every tier shows in ls, show, scrub, gc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from mouthguard.jobs.replicator import Replicator
from tests.checkpoint.helpers import flip_byte


def _copy_dirs(root: Path, step: int) -> list[Path]:
    return [root / tier / "r" / f"{step:012d}" for tier in ("fast", "durable")]


@pytest.fixture
def damaged_store(tmp_path: Path) -> Path:
    """Steps 1-3, each on both tiers; step 2's manifest broken everywhere, step 3's data."""
    root = tmp_path / "store"
    store = mouthguard.open_store(root)
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.arange(4096, dtype=torch.float32)}, importance="milestone")
    assert Replicator(store).run_once().protected == 3
    fast2, durable2 = _copy_dirs(root, 2)
    flip_byte(fast2 / "manifest.json", 10)
    (durable2 / "manifest.json").write_bytes((durable2 / "manifest.json").read_bytes()[:40])
    for copy in _copy_dirs(root, 3):
        flip_byte(copy / "rank-00000.safetensors", 6000)  # silent: receipts still vouch
    return root


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_lists_a_checkpoint_whose_manifest_no_tier_can_read(
    damaged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--store", str(damaged_store), "ls", "--json")
    assert code == 0
    lines = {d["step"]: d for d in map(json.loads, out.splitlines())}
    assert sorted(lines) == [1, 2, 3]
    assert lines[2]["state"] == "damaged" and lines[2]["importance"] is None
    assert {c["tier"] for c in lines[2]["copies"]} == {"fast", "durable"}
    assert all(c["damage"] for c in lines[2]["copies"])
    code, out, _ = _run(capsys, "--store", str(damaged_store), "ls")
    assert code == 0 and "damaged" in out and "r step 2" in out
    assert "fast✗" in out and "durable✗" in out


def test_after_verify_finds_a_copy_invalid_ls_shows_it_damaged_not_verified(
    damaged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--store", str(damaged_store), "ls", "--json")
    before = {d["step"]: d for d in map(json.loads, out.splitlines())}
    assert before[3]["state"] == "protected"  # the receipts were written before the rot
    code, out, _ = _run(capsys, "--store", str(damaged_store), "verify", "r", "3")
    assert code == 1 and "INVALID (damaged)" in out
    code, out, _ = _run(capsys, "--store", str(damaged_store), "ls", "--json")
    after = {d["step"]: d for d in map(json.loads, out.splitlines())}
    assert after[3]["state"] == "damaged"
    assert all(c["damage"] and not c["verified"] for c in after[3]["copies"])
    assert after[1]["state"] == "protected"


def test_show_names_an_unreadable_checkpoint_and_exits_1(
    damaged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "--store", str(damaged_store), "show", "r", "2")
    assert code == 1
    assert "r step 2 is committed but its manifest cannot be read on any tier" in err
    assert "fast:" in err and "durable:" in err
    code, _, err = _run(capsys, "--store", str(damaged_store), "show", "r", "9")
    assert code == 2 and "no committed checkpoint r step 9" in err


def test_scrub_exits_1_and_names_the_checkpoints_lost_on_every_tier(
    damaged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--store", str(damaged_store), "scrub", "--json")
    assert code == 1
    lines = [json.loads(line) for line in out.splitlines()]
    copies = [d for d in lines if d["kind"] == "copy"]
    assert {(d["step"], d["status"]) for d in copies} == {(1, "ok"), (2, "damaged"), (3, "damaged")}
    lost = sorted(d["step"] for d in lines if d["kind"] == "damaged_checkpoint")
    assert lost == [2, 3]
    assert lines[-1]["kind"] == "summary" and lines[-1]["damaged_checkpoints"] == 2
    code, out, _ = _run(capsys, "--store", str(damaged_store), "scrub")
    assert code == 1 and "r step 2 is damaged on every tier" in out
    # Nothing was moved: the damaged copies stay for inspection.
    assert all((d / "manifest.json").exists() for d in _copy_dirs(damaged_store, 2))


def test_gc_and_doctor_name_them(damaged_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--store", str(damaged_store), "gc", "--json")
    assert code == 0
    lost = [json.loads(line) for line in out.splitlines() if "damaged_checkpoint" in line]
    assert [d["step"] for d in lost] == [2]  # step 3's damage is not known until read
    code, out, _ = _run(capsys, "--store", str(damaged_store), "gc")
    assert "damaged on every tier" in out and "never deleted automatically" in out
    code, out, _ = _run(capsys, "--store", str(damaged_store), "doctor", "--json")
    body = json.loads(out)
    assert code == 1 and not body["ok"]
    assert any("r step 2 is damaged on every tier" in p for p in body["problems"])


def test_ls_and_doctor_show_the_steps_held_in_peer_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, shm = tmp_path / "store", tmp_path / "shm"
    peers = mouthguard.PeerMemory(replication_factor=1, path=shm, domains={0: "n0"}, keep=2)
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(root), "r", background=False, peers=peers)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.arange(4096, dtype=torch.float32)})  # routine: memory only
    code, out, _ = _run(capsys, "--store", str(root), "ls", "r", "--peers", str(shm), "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["kind"], r["node"], r["step"], r["ranks"]) for r in rows] == [
        ("peer-memory", "n0", 2, [0]),
        ("peer-memory", "n0", 3, [0]),
    ]
    assert all(r["bytes"] > 4096 * 4 for r in rows)  # the rank file and the manifest
    code, out, _ = _run(capsys, "--store", str(root), "ls", "--peers", str(shm))
    assert code == 0 and "peer memory" in out and "n0" in out and "no checkpoints" in out
    code, out, _ = _run(capsys, "--store", str(root), "ls", "--peers", str(tmp_path / "none"))
    assert code == 0 and "no checkpoints" in out
    code, out, _ = _run(capsys, "--store", str(root), "doctor", "--peers", str(shm), "--json")
    summary = json.loads(out)["peer_memory"]
    assert summary == {"path": str(shm), "nodes": 1, "steps": 2, "bytes": summary["bytes"]}
    assert summary["bytes"] == sum(r["bytes"] for r in rows)
    code, out, _ = _run(capsys, "--store", str(root), "doctor", "--peers", str(shm))
    assert "peer memory" in out and "2 step(s) held" in out
