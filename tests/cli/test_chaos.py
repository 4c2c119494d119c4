"""``mouthguard chaos``: options, output, exit codes, and the scratch run cleaned up."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.chaos import DEFAULT_FAULTS
from mouthguard.cli import chaos
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK
from mouthguard.tiers.faults import FaultPlan


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mouthguard")
    chaos.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["chaos", *argv])


def _store(tmp_path: Path) -> mouthguard.Store:
    store = mouthguard.open_store(tmp_path / "store")
    mouthguard.Checkpointer(store, "mine", background=False).save(1, {"w": torch.ones(8)})
    return store


def _keys(store: mouthguard.Store) -> dict[str, list[str]]:
    """Every key but the audit trail's (it keeps the record of chaos's acts: append-only)."""
    return {t.name: [k for k in t.list() if not k.startswith("_audit/")] for t in store.tiers}


def test_defaults_and_options() -> None:
    args = _parse()
    assert (args.rounds, args.seed, args.json, args.keep) == (50, 0, False, False)
    assert args.faults == FaultPlan.parse(DEFAULT_FAULTS)
    args = _parse("--rounds", "3", "--faults", "error=0.1,delay=0.5:0.01", "--seed", "9")
    assert args.faults == FaultPlan(error=0.1, delay=0.5, delay_seconds=0.01)
    assert (args.rounds, args.seed) == (3, 9)


@pytest.mark.parametrize("argv", [["--faults", "nope=1"], ["--rounds", "0"], ["--seed", "x"]])
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        _parse(*argv)
    assert excinfo.value.code == 2


def test_json_run_exits_0_and_removes_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(tmp_path)
    before = _keys(store)
    args = _parse("--rounds", "4", "--faults", "enospc=0.05,fsync=0.05,torn=0.02", "--json")
    assert chaos.run(store, args, mouthguard_console()) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["rounds"] == 4 and out["kept"] is False
    assert out["run"].startswith("chaos-") and out["cases"] == sum(out["injected"].values())
    assert out["accepted_corrupt"] == out["lost_acknowledged"] == out["writes_outside"] == 0
    assert _keys(store) == before  # the scratch run is gone, "mine" untouched


def test_table_output_and_keep(tmp_path: Path) -> None:
    store = _store(tmp_path)
    buf = io.StringIO()
    console = mouthguard_console(buf)
    args = _parse("--rounds", "2", "--faults", "error=0.01,delay=0.1:0.0001", "--keep")
    assert chaos.run(store, args, console) == EXIT_OK
    text = buf.getvalue()
    assert "injected faults" in text and "invariants" in text
    assert "acknowledged saves lost" in text and "kept as run chaos-" in text
    runs = {key.split("/")[0] for key in store.fast.list()}
    assert "mine" in runs and any(r.startswith("chaos-") for r in runs)


def test_a_violation_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mouthguard.checkpoint import reader  # noqa: PLC0415

    monkeypatch.setattr(reader, "verify_digest", lambda hasher, record: None)
    store = _store(tmp_path)
    buf = io.StringIO()
    args = _parse("--rounds", "6", "--faults", "torn=0.5,keys=rank-", "--seed", "2")
    assert chaos.run(store, args, mouthguard_console(buf)) == EXIT_FAILED
    assert "violation:" in buf.getvalue()


def mouthguard_console(buf: io.StringIO | None = None) -> chaos.Console:
    return chaos.Console(file=buf or io.StringIO(), width=200)
