"""``mouthguard gc|promote|hold|release|restore|scrub``, states in ls/show, sidecars in verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from tests.checkpoint.helpers import flip_byte
from tests.cli.helpers import alpha_store, show_json


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich reads COLUMNS: wide enough that table cells are never cut."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Default two-tier store (fast + durable): run alpha 10 routine, 20 milestone, replicated."""
    return alpha_store(tmp_path)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """Run t: three transient saves (keep-last 1, trash delay 0), fast tier only."""
    path = tmp_path / "scratch"
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(path), "t", background=False)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((8,), float(step))}, importance="transient")
    return path


def copy_dir(root: Path, tier: str, run: str, step: int) -> Path:
    store = mouthguard.open_store(root, create=False)
    return Path(store.tier(tier).location(f"{run}/{step:012d}/"))


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, object]]]:
    capsys.readouterr()
    code = main(list(args))
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    return code, lines


def tiers_of(info: dict[str, object]) -> set[tuple[object, object]]:
    """``{(tier, verified)}`` of the copies in a ``show --json`` object."""
    copies = info["copies"]
    assert isinstance(copies, list)
    return {(c["tier"], c["verified"]) for c in copies}


# --- gc --------------------------------------------------------------------------------


def test_gc_is_a_dry_run_by_default(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_json(capsys, "--store", str(scratch), "gc", "--json")
    assert code == 0
    verdicts = {(d["step"], d["verdict"]) for d in lines if d["kind"] == "checkpoint"}
    assert verdicts == {(1, "delete"), (2, "delete"), (3, "keep")}
    for d in lines:
        if d["kind"] == "checkpoint":
            assert d["importance"] == "transient" and d["reasons"]
    actions = [d for d in lines if d["kind"] == "action"]
    assert {(a["step"], a["tier"], a["action"], a["status"]) for a in actions} == {
        (1, "fast", "trash", "would do"),
        (2, "fast", "trash", "would do"),
    }
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["dry_run"] is True
    assert (summary["keep"], summary["delete"], summary["trash"]) == (1, 2, 2)
    # Nothing changed.
    assert show_json(scratch, "t", 1, capsys)["state"] != "trashed"
    assert main(["--store", str(scratch), "gc"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and "DELETE" in out and "KEEP" in out and "--apply" in out


def test_gc_apply_trashes_then_purges(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_json(capsys, "--store", str(scratch), "gc", "--apply", "--json")
    assert code == 0
    actions = [d for d in lines if d["kind"] == "action"]
    assert {(a["step"], a["action"], a["status"]) for a in actions} == {
        (1, "trash", "done"),
        (2, "trash", "done"),
    }
    assert show_json(scratch, "t", 1, capsys)["state"] == "trashed"
    assert show_json(scratch, "t", 3, capsys)["state"] != "trashed"
    # Transient's trash delay is 0: the next pass purges.
    assert main(["--store", str(scratch), "gc", "--apply"]) == 0
    out = capsys.readouterr().out
    assert "purge" in out and "applied" in out
    code, rows = run_json(capsys, "--store", str(scratch), "ls", "--json")
    assert code == 0 and [r["step"] for r in rows] == [3]


def test_gc_apply_removes_old_interrupted_saves(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    partial = scratch / "fast" / "t" / "000000000030.partial-0123456789abcdef"
    partial.mkdir()
    (partial / "rank-00000.safetensors").write_bytes(b"half")
    assert main(["--store", str(scratch), "gc", "--grace-seconds", "0"]) == 0
    assert "would remove interrupted save" in capsys.readouterr().out
    assert partial.exists()  # dry run
    assert main(["--store", str(scratch), "gc", "--apply"]) == 0
    assert partial.exists()  # younger than the default grace
    code, lines = run_json(
        capsys, "--store", str(scratch), "gc", "--apply", "--grace-seconds", "0", "--json"
    )
    assert code == 0 and not partial.exists()
    saves = [d for d in lines if d["kind"] == "interrupted_save"]
    assert len(saves) == 1 and saves[0]["removed"] is True and saves[0]["step"] == 30


def test_gc_keeps_held_and_rejects_bad_arguments(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(scratch), "hold", "t", "1", "--reason", "investigate"]) == 0
    code, lines = run_json(capsys, "--store", str(scratch), "gc", "t", "--json")
    assert code == 0
    held = next(d for d in lines if d["kind"] == "checkpoint" and d["step"] == 1)
    assert held["verdict"] == "keep" and "held" in str(held["reasons"])
    assert main(["--store", str(scratch), "gc", "../x"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--store", str(scratch), "gc", "--grace-seconds", "-1"])
    assert exc.value.code == 2


# --- promote / hold / release ------------------------------------------------------------


def test_promote_and_importance_alias(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(root)
    assert main(["--store", store, "promote", "alpha", "10", "critical", "--reason", "rc"]) == 0
    assert "was routine" in capsys.readouterr().out
    assert show_json(root, "alpha", 10, capsys)["importance"] == "critical"
    assert main(["--store", store, "importance", "alpha", "10", "milestone"]) == 0
    assert show_json(root, "alpha", 10, capsys)["importance"] == "milestone"
    assert main(["--store", store, "promote", "alpha", "10", "precious"]) == 2
    assert main(["--store", store, "promote", "alpha", "99", "critical"]) == 2
    assert main(["--store", store, "promote", "nosuchrun", "10", "critical"]) == 2


def test_hold_with_reason_and_release(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(root)
    assert main(["--store", store, "hold", "alpha", "10", "--reason", "legal", "--name", "x"]) == 0
    assert show_json(root, "alpha", 10, capsys)["holds"] == ["x"]
    assert main(["--store", store, "release", "alpha", "10", "--name", "x"]) == 0
    assert main(["--store", store, "release", "alpha", "10", "--name", "x"]) == 1
    assert show_json(root, "alpha", 10, capsys)["holds"] == []


# --- restore -----------------------------------------------------------------------------


def test_restore_copies_a_lost_copy_back(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    durable = copy_dir(root, "durable", "alpha", 20)
    shutil.rmtree(durable)
    assert tiers_of(show_json(root, "alpha", 20, capsys)) == {("fast", True)}
    assert main(["--store", str(root), "restore", "alpha", "20", "--to", "durable"]) == 0
    assert "restored alpha step 20 to durable from fast" in capsys.readouterr().out
    copies = tiers_of(show_json(root, "alpha", 20, capsys))
    assert copies == {("fast", True), ("durable", True)}
    assert main(["--store", str(root), "verify", "alpha", "20"]) == 0


def test_restore_when_already_valid(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", str(root), "restore", "alpha", "10", "--to", "fast"]) == 0
    assert "already holds a valid copy" in capsys.readouterr().out


def test_restore_replaces_a_damaged_copy(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(copy_dir(root, "fast", "alpha", 10) / "rank-00000.safetensors", -1)
    assert main(["--store", str(root), "restore", "alpha", "10", "--to", "fast"]) == 0
    out = capsys.readouterr().out
    assert "damaged" in out and "from durable" in out
    assert main(["--store", str(root), "verify", "alpha", "10"]) == 0


def test_restore_without_intact_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lonely"
    store = mouthguard.open_store(path)
    mouthguard.Checkpointer(store, "a", background=False).save(5, {"w": torch.ones(16)})
    flip_byte(copy_dir(path, "fast", "a", 5) / "rank-00000.safetensors", -1)
    # The only copy is damaged: nothing to copy from.
    assert main(["--store", str(path), "restore", "a", "5", "--to", "durable"]) == 1
    err = capsys.readouterr().err
    assert "no intact source" in err and "from fast" in err and "corrupt" in err
    assert "Traceback" not in err
    assert not (copy_dir(path, "durable", "a", 5) / "manifest.json").exists()
    # Restoring onto the tier of the only (damaged) copy: no other tier has one.
    assert main(["--store", str(path), "restore", "a", "5", "--to", "fast"]) == 1
    captured = capsys.readouterr()
    assert "damaged" in captured.out
    assert "no copy on any tier other than fast" in captured.err


def test_restore_usage_errors(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(root)
    assert main(["--store", store, "restore", "alpha", "10", "--to", "tape"]) == 2
    assert "no tier 'tape'" in capsys.readouterr().err
    assert main(["--store", store, "restore", "alpha", "99", "--to", "durable"]) == 2
    assert main(["--store", store, "restore", "nosuch", "10", "--to", "durable"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--store", store, "restore", "alpha", "10"])  # --to is required
    assert exc.value.code == 2


# --- scrub --------------------------------------------------------------------------------


def test_scrub_all_ok(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_json(capsys, "--store", str(root), "scrub", "--json")
    assert code == 0
    copies = [d for d in lines if d["kind"] == "copy"]
    assert len(copies) == 4 and all(d["status"] == "ok" for d in copies)
    assert lines[-1] == {
        "kind": "summary",
        "scrubbed": 4,
        "ok": 4,
        "damaged": 0,
        "unreachable": 0,
        "skipped_fresh": 0,
        "skipped_budget": 0,
        "damaged_checkpoints": 0,
    }
    # Just verified: a max age skips them all.
    code, lines = run_json(
        capsys, "--store", str(root), "scrub", "--max-age-seconds", "3600", "--json"
    )
    assert code == 0 and lines[-1]["skipped_fresh"] == 4 and lines[-1]["scrubbed"] == 0
    assert main(["--store", str(root), "scrub"]) == 0
    assert "4 ok, 0 damaged" in capsys.readouterr().out


def test_scrub_reports_damage(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(copy_dir(root, "durable", "alpha", 20) / "rank-00000.safetensors", -1)
    assert main(["--store", str(root), "scrub"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "durable" in out and "3 ok, 1 damaged" in out
    # The damaged copy is reported, not moved: restore replaces it from the intact one.
    assert main(["--store", str(root), "restore", "alpha", "20", "--to", "durable"]) == 0
    assert main(["--store", str(root), "scrub"]) == 0


def test_scrub_budget_and_bad_arguments(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run_json(capsys, "--store", str(root), "scrub", "--budget-bytes", "1", "--json")
    assert code == 0 and lines[-1]["scrubbed"] == 1
    for bad in (["--budget-bytes", "-1"], ["--max-age-seconds", "nan"]):
        with pytest.raises(SystemExit) as exc:
            main(["--store", str(root), "scrub", *bad])
        assert exc.value.code == 2


# --- ls / show state, verify sidecars --------------------------------------------------


def test_ls_and_show_display_the_state(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(root), "ls"]) == 0
    out = capsys.readouterr().out
    assert "state" in out and "protected" in out
    lonely = tmp_path / "lonely"
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(lonely), "a", background=False)
    ckpt.save(5, {"w": torch.ones(4)}, importance="milestone")
    assert main(["--store", str(lonely), "show", "a", "5"]) == 0
    out = capsys.readouterr().out
    info = show_json(lonely, "a", 5, capsys)
    assert "state" in out and str(info["state"]) in out
    assert info["state"] != "protected" and info["protection_missing"]
    assert "missing for protection" in out


def test_verify_checks_every_sidecar(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", str(root), "hold", "alpha", "10", "--reason", "keep"]) == 0
    assert main(["--store", str(root), "verify"]) == 0
    sidecar = copy_dir(root, "durable", "alpha", 10) / "sidecar.hold.hold.json"
    assert sidecar.is_file()
    sidecar.write_bytes(b'{"name": "hold", "reason": "ke')  # truncated
    capsys.readouterr()
    assert main(["--store", str(root), "verify"]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "durable" in out and "sidecar.hold.hold.json" in out
    code, lines = run_json(capsys, "--store", str(root), "verify", "alpha", "10", "--json")
    assert code == 1
    verdicts = {(d["tier"], d["ok"]) for d in lines}
    assert verdicts == {("fast", True), ("durable", False)}
    bad = next(d for d in lines if not d["ok"])
    assert "sidecar on durable sidecar.hold.hold.json" in str(bad["reason"])
    sidecar.write_bytes(b"[1, 2]")  # valid JSON, not an object
    assert main(["--store", str(root), "verify", "alpha", "10"]) == 1


def test_gc_apply_refuses_to_start_deleting_a_milestone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m"
    (path.parent / "m.toml").write_text(
        f'[[tiers]]\nname = "fast"\nkind = "local"\npath = "{path}"\n'
        "[policy.milestone]\nkeep_last = 1\n"
    )
    ckpt = mouthguard.Checkpointer(mouthguard.open_store(path.parent / "m.toml"), "m")
    for step in (1, 2, 3, 4):
        ckpt.save(step, {"w": torch.ones(4)}, importance="milestone" if step == 1 else "routine")
    ckpt.save(5, {"w": torch.ones(4)}, importance="milestone")
    store = str(path.parent / "m.toml")
    # Dry run: the refusal is shown, exit 0.
    code, lines = run_json(capsys, "--store", store, "gc", "--json")
    assert code == 0
    (refused,) = [d for d in lines if d["kind"] == "refused"]
    assert refused["dry_run"] is True and "milestone step(s) 1" in str(refused["why"])
    capsys.readouterr()
    assert main(["--store", store, "gc", "--apply"]) == 3
    out = capsys.readouterr().out
    assert "refused the deletions in run m" in out and "step 1 (milestone)" in out
    assert "--force" in out
    assert all(c.trashed_at is None for i in ckpt.list() for c in i.copies)
    assert main(["--store", store, "gc", "--apply", "--force"]) == 0
    assert ckpt.info(1) is not None and ckpt.info(1).state == "trashed"  # type: ignore[union-attr]


def test_gc_max_delete_share_must_be_a_share(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--store", str(root), "gc", "--max-delete-share", "2"])
    assert exited.value.code == 2
    assert "must be a number in (0, 1]" in capsys.readouterr().err
