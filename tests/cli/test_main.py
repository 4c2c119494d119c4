"""The ``mouthguard`` CLI: listing, showing, verifying; exit codes; no tracebacks on bad data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.main import main
from mouthguard.format.manifest import seal
from tests.checkpoint.helpers import flip_byte, step_path


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    # No background replication: each checkpoint has exactly its fast copy, so the
    # listings below are deterministic. (Replication is tested in tests/jobs.)
    ckpt = mouthguard.Checkpointer(root, run="alpha", background=False)
    ckpt.save(10, {"w": torch.ones(100)}, importance="routine")
    ckpt.save(20, {"w": torch.ones(100) * 2}, importance="milestone")
    beta = mouthguard.Checkpointer(root, run="beta", background=False)
    beta.save(1, {"x": torch.zeros(3)}, importance="golden")
    return root


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "mouthguard.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_ls_json_lists_committed_checkpoints(
    populated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(populated), "ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["run"], r["step"], r["importance"]) for r in rows] == [
        ("alpha", 10, "routine"),
        ("alpha", 20, "milestone"),
        ("beta", 1, "critical"),
    ]


def test_ls_table_and_run_filter(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", str(populated), "ls", "alpha"]) == 0
    out = capsys.readouterr().out
    assert "milestone" in out and "beta" not in out
    assert main(["--store", str(populated), "ls", "nosuchrun"]) == 2


def test_show_json_has_the_contracted_fields(
    populated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(populated), "show", "alpha", "20", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"] == "alpha" and shown["step"] == 20 and shown["importance"] == "milestone"
    assert shown["nbytes"] == sum(f["size"] for f in shown["files"])
    (file,) = shown["files"]
    assert file["name"] == "rank-00000.safetensors" and file["checksum"].startswith("xxh3-128:")
    (copy,) = shown["copies"]
    assert copy["tier"] == "fast" and copy["verified"] is False
    assert Path(copy["location"]) == populated.resolve() / "fast" / "alpha" / "000000000020"
    assert (Path(copy["location"]) / "manifest.json").is_file()


def test_verify_records_receipts_shown_by_show(
    populated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(populated), "verify"]) == 0
    assert "3 valid, 0 invalid" in capsys.readouterr().out
    assert main(["--store", str(populated), "show", "beta", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["copies"][0]["verified"] is True


def test_verify_detects_a_flipped_byte(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = mouthguard.open_store(populated)
    flip_byte(step_path(store, "alpha", 20) / "rank-00000.safetensors", 4200)
    assert main(["--store", str(populated), "verify", "alpha"]) == 1
    assert "1 valid, 1 invalid" in capsys.readouterr().out
    assert main(["--store", str(populated), "verify", "alpha", "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["step"], r["ok"]) for r in rows] == [(10, True), (20, False)]
    assert "checksum mismatch" in rows[1]["reason"]
    assert main(["--store", str(populated), "verify", "alpha", "10"]) == 0
    assert main(["--store", str(populated), "verify", "beta"]) == 0


def test_verify_rejects_manifest_naming_files_outside(populated: Path) -> None:
    """A (correctly checksummed) manifest pointing outside its checkpoint is invalid, and
    nothing outside is read: the target is a FIFO that would block any reader."""
    store = mouthguard.open_store(populated)
    path = step_path(store, "alpha", 10) / "manifest.json"
    body = json.loads(path.read_text())
    del body["manifest_checksum"]
    outside = populated.parent / "outside"
    os.mkfifo(outside)
    body["files"][0]["name"] = "../../../outside"
    for tensor in body["tensors"]:
        tensor["file"] = "../../../outside"
    path.write_bytes(seal(body))
    result = run_cli("--store", str(populated), "verify", "alpha", "10")
    assert result.returncode == 1, result.stderr
    assert "outside" in result.stdout and "INVALID" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_garbage_manifest_gives_exit_1_without_traceback(populated: Path) -> None:
    store = mouthguard.open_store(populated)
    (step_path(store, "beta", 1) / "manifest.json").write_bytes(b"\x00garbage{{{" * 100)
    result = run_cli("--store", str(populated), "verify")
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "INVALID" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "alpha", "notanumber"],
        ["verify", "nosuchrun"],
        ["verify", "alpha", "99"],
        ["show", "alpha", "99"],
        ["show", "../etc", "1"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_2(populated: Path, args: list[str]) -> None:
    result = run_cli("--store", str(populated), *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


def test_missing_store_is_a_usage_error_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    result = run_cli("--store", str(missing), "ls")
    assert result.returncode == 2 and "no store" in result.stderr
    assert not missing.exists()


def test_store_from_environment(populated: Path) -> None:
    result = run_cli("ls", "--json", env={"MOUTHGUARD_STORE": str(populated)})
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 3


def test_gc_removes_only_old_partials(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partial = populated / "fast" / "alpha" / "000000000030.partial-0123456789abcdef"
    partial.mkdir()
    (partial / "rank-00000.safetensors").write_bytes(b"half")
    assert main(["--store", str(populated), "gc", "--apply"]) == 0
    assert partial.exists()
    assert main(["--store", str(populated), "gc", "--apply", "--grace-seconds", "0"]) == 0
    assert not partial.exists()
    assert "1 interrupted save(s)" in capsys.readouterr().out
    alpha = mouthguard.Checkpointer(populated, run="alpha", background=False)
    assert [i.step for i in alpha.list()] == [10, 20]
