"""The snapshot says what ``ls`` and ``gc`` say: it judges with the same functions."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from mouthguard.dashboard.snapshot import STATES, summary, take_snapshot
from tests.checkpoint.helpers import step_path


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _lines(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_rows_agree_with_ls(ops: mouthguard.Store, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = take_snapshot(ops, now=_now, monotonic=time.monotonic)
    listed = _lines(["--store", str(ops.source), "ls", "--json"], capsys)
    assert [(r["run"], r["step"]) for r in snapshot.rows] == [
        (item["run"], item["step"]) for item in listed
    ]
    for row, item in zip(snapshot.rows, listed, strict=True):
        assert row["state"] == item["state"] and row["importance"] == item["importance"]
        assert row["holds"] == item["holds"] and row["nbytes"] == item["nbytes"]
        assert row["protection_missing"] == item["protection_missing"]
        copies = item["copies"]
        assert isinstance(copies, list)
        assert [(c["tier"], c["verified"], c["damage"]) for c in row["copies"]] == [
            (c["tier"], c["verified"], c["damage"]) for c in copies
        ]


def test_states_of_the_ops_store(ops: mouthguard.Store) -> None:
    snapshot = take_snapshot(ops, now=_now, monotonic=time.monotonic)
    state = {(r["run"], r["step"]): r["state"] for r in snapshot.rows}
    assert state[("alpha", 10)] == "protected" and state[("alpha", 20)] == "protected"
    assert state[("alpha", 30)] == "committed"
    held = snapshot.row("alpha", 20)
    assert held is not None and held["held"] and held["holds"] == ["release-candidate"]
    damaged = snapshot.row("beta", 5)
    assert damaged is not None
    (fast,) = [c for c in damaged["copies"] if c["tier"] == "fast"]
    assert fast["damage"] and not fast["verified"]
    assert all(r["state"] in STATES for r in snapshot.rows)


def test_save_timing_and_throughput(ops: mouthguard.Store) -> None:
    snapshot = take_snapshot(ops, now=_now, monotonic=time.monotonic)
    sync, asynchronous = snapshot.row("alpha", 10), snapshot.row("alpha", 20)
    assert sync is not None and asynchronous is not None
    assert sync["save"]["mode"] == "sync"
    assert sync["save"]["stall_seconds"] == sync["save"]["seconds"]
    assert sync["save"]["bytes_per_second"] == pytest.approx(
        sync["nbytes"] / sync["save"]["seconds"]
    )
    assert asynchronous["save"]["mode"] == "async"
    # An ordering, not a speed: the stall ends before the save does, on the same clock.
    assert asynchronous["save"]["stall_seconds"] <= asynchronous["save"]["seconds"]


def test_reference_values_are_finite_numbers_only(ops: mouthguard.Store) -> None:
    row = take_snapshot(ops, now=_now, monotonic=time.monotonic).row("alpha", 30)
    assert row is not None and row["metrics"] == {"tokens": 4096.0}  # the nan loss is not one
    json.dumps(row, allow_nan=False)  # what the API's JSON responses require


def test_pending_is_what_gc_dry_run_would_do(
    ops: mouthguard.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = take_snapshot(ops, now=_now, monotonic=time.monotonic)
    gc = _lines(["--store", str(ops.source), "gc", "--json"], capsys)
    actions = sorted(
        (line["run"], line["step"], line["tier"], line["action"], line["reason"])
        for line in gc
        if line["kind"] == "action"
    )
    pending = sorted(
        (p["run"], p["step"], p["tier"], p["action"], p["reason"]) for p in snapshot.pending
    )
    assert pending == actions
    assert {(p[0], p[1], p[3]) for p in pending} >= {("beta", 1, "trash"), ("beta", 2, "trash")}
    verdicts = {(line["run"], line["step"]): line["verdict"] for line in gc if "verdict" in line}
    assert {(r["run"], r["step"]): r["retention"]["verdict"] for r in snapshot.rows} == verdicts


def test_the_snapshot_changes_nothing(ops: mouthguard.Store) -> None:
    def files() -> list[tuple[str, int]]:
        root = Path(str(ops.source))
        return sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file())

    before = files()
    take_snapshot(ops, now=_now, monotonic=time.monotonic)
    assert files() == before


def test_an_unreadable_checkpoint_is_listed_damaged(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, "r", background=False)
    ckpt.save(1, {"w": mouthguard_tensor()})
    manifest = step_path(store, "r", 1) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-20])
    snapshot = take_snapshot(store, now=_now, monotonic=time.monotonic)
    (row,) = snapshot.rows
    assert row["state"] == "damaged" and row["importance"] is None
    assert "manifest cannot be read" in row["protection_missing"][0]
    assert row["retention"]["verdict"] == "keep"  # never deleted automatically
    assert summary(snapshot, now=_now())["by_state"]["damaged"] == 1


def test_summary_counts(ops: mouthguard.Store) -> None:
    snapshot = take_snapshot(ops, now=_now, monotonic=time.monotonic)
    body = summary(snapshot, now=snapshot.taken_at)
    assert body["checkpoints"] == len(snapshot.rows) == 8
    assert sum(body["by_state"].values()) == 8
    unprotected = [r for r in snapshot.rows if r["state"] in ("committed", "verified")]
    assert body["unprotected_bytes"] == sum(r["nbytes"] for r in unprotected) > 0
    alpha = next(r for r in body["runs"] if r["run"] == "alpha")
    assert alpha["newest_step"] == 30 and alpha["newest_protected_step"] == 20
    assert alpha["held"] == 1 and alpha["last_save"]["step"] == 30
    assert body["age_seconds"] == 0.0


def mouthguard_tensor() -> object:
    import torch  # noqa: PLC0415

    return torch.ones(8)


def test_rows_carry_their_latest_acts(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, "r", background=False, actor="alice@lab")
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.hold(1, "legal", reason="case 42")
    row = take_snapshot(store, now=_now, monotonic=time.monotonic).row("r", 1)
    assert row is not None
    assert [(a["act"], a["actor"], a["status"]) for a in row["acts"]] == [
        ("hold", "alice@lab", "done"),
        ("commit", "alice@lab", "done"),
    ]


def test_a_refresh_reads_only_the_newest_records_of_the_trail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, "r", background=False, actor="alice@lab")
    ckpt.save(1, {"w": torch.ones(2)})
    ckpt.save(2, {"w": torch.ones(2)})
    ckpt.hold(2, "legal", reason="case 42")  # the last act: its intent and outcome
    # Only those two records are read; step 1's acts lie past the bound.
    monkeypatch.setattr("mouthguard.dashboard.snapshot.TRAIL_RECORDS_READ", 2)
    snap = take_snapshot(store, now=_now, monotonic=time.monotonic)
    one, two = snap.row("r", 1), snap.row("r", 2)
    assert one is not None and two is not None
    assert one["acts"] == []
    assert [a["act"] for a in two["acts"]] == ["hold"]
