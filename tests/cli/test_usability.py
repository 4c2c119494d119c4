"""The command line as a newcomer meets it: pipes, errors, where --store goes, --json, aliases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mouthguard
from mouthguard.cli.common import EXIT_BROKEN_PIPE
from mouthguard.cli.main import main
from tests.cli.helpers import alpha_store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A two-tier store: run alpha, step 10 routine and step 20 milestone, replicated."""
    return alpha_store(tmp_path)


def json_out(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Exit code and the JSON lines on stdout of ``mouthguard ARGS`` (run in-process)."""
    capsys.readouterr()
    code = main(list(args))
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def cli(*args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mouthguard.cli.main", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        # A terminal width inherited from the test runner (pytest-xdist workers carry
        # COLUMNS) would stand for the user's explicit choice: these tests pipe with none.
        env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
        check=False,
    )


# --- pipes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["ls", "--json"], ["ls"], ["verify"], ["gc", "--json"], ["scrub", "--json"]],
    ids=" ".join,
)
def test_a_reader_that_went_away_ends_the_command_quietly(root: Path, args: list[str]) -> None:
    """`mouthguard ls --json | head -1`: no BrokenPipeError traceback, the status of SIGPIPE."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails with EPIPE
    try:
        result = cli("--store", str(root), *args, stdout=write)
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE


def test_help_into_a_closed_pipe_is_quiet() -> None:
    read, write = os.pipe()
    os.close(read)
    try:
        result = cli("--help", stdout=write)
    finally:
        os.close(write)
    assert result.stderr == ""


# --- stores --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["ls"], ["show", "a", "1"], ["verify"], ["scrub"], ["gc"], ["doctor"], ["replicate"]],
    ids=" ".join,
)
def test_commands_that_read_do_not_turn_a_directory_into_a_store(
    tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "just-a-directory"
    plain.mkdir()
    assert main(["--store", str(plain), *args]) == 2
    assert f"no store at {plain}" in capsys.readouterr().err
    assert list(plain.iterdir()) == []


def test_store_may_follow_the_command(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows = json_out(capsys, "ls", "--json", "--store", str(root))
    assert code == 0 and len(rows) == 2
    # After the command wins over before it (the last one given counts).
    code, rows = json_out(capsys, "--store", "/nonexistent", "ls", "--store", str(root), "--json")
    assert code == 0 and len(rows) == 2


# --- argument errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chaos", "--rounds", "0"], "argument --rounds: must be an integer >= 1: '0'"),
        (["chaos", "--faults", "bogus=1"], "argument --faults: "),
        (["gc", "--grace-seconds", "soon"], "argument --grace-seconds: not a number: 'soon'"),
        (["scrub", "--budget-bytes", "-1"], "argument --budget-bytes: must be an integer >= 0"),
        (["agent", "--interval", "0"], "argument --interval: must be > 0: '0'"),
        (["show", "alpha", "ten"], "argument step: must be an integer >= 0: 'ten'"),
    ],
)
def test_a_bad_value_is_one_line_in_plain_words(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    first, hint = err.splitlines()  # no usage dump
    assert first.startswith(f"error: {message}")
    assert hint == f"run 'mouthguard {args[0]} --help' for usage"
    for python_name in ("invalid", "_rounds", "non_negative", "parse value"):
        assert python_name not in err


def test_an_unknown_command_points_to_the_main_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["frobnicate"])
    assert capsys.readouterr().err.splitlines()[-1] == "run 'mouthguard --help' for usage"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mouthguard {mouthguard.__version__}\n"


def test_help_names_positionals_and_verify_states_its_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "0 every copy is valid; 1 a copy or one of its sidecars is invalid; 2 usage" in text
    assert "only this run" in text and "only this step of RUN" in text
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    assert "the checkpoint's step" in capsys.readouterr().out


# --- output width ------------------------------------------------------------------------


def test_piped_errors_and_tables_are_not_wrapped(tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / "no-store-here"
    result = cli("--store", str(deep), "ls")
    assert result.returncode == 2
    assert result.stderr == f"error: no store at {deep}\n"
    store = tmp_path / ("long-" * 20) / "store"
    mouthguard.open_store(store)
    doctor = cli("--store", str(store), "doctor")
    assert str(store.resolve() / "durable") in doctor.stdout  # one cell, not cut or broken


# --- promote / demote, --json ----------------------------------------------------------------


def test_demote_is_promote_by_another_name(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, (out,) = json_out(
        capsys, "--store", str(root), "demote", "alpha", "20", "routine", "--json"
    )
    assert code == 0
    assert out == {
        "run": "alpha",
        "step": 20,
        "was": "milestone",
        "changed": True,
        "importance": "routine",
        "saved_importance": "milestone",
        "holds": [],
    }
    code, (out,) = json_out(
        capsys, "--store", str(root), "promote", "alpha", "20", "critical", "--json"
    )
    assert code == 0 and out["was"] == "routine" and out["importance"] == "critical"


def test_hold_and_release_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(root)
    code, (out,) = json_out(
        capsys, "--store", store, "hold", "alpha", "10", "--name", "x", "--json"
    )
    assert code == 0 and out["hold"] == "x" and out["placed"] is True and out["holds"] == ["x"]
    code, (out,) = json_out(
        capsys, "release", "alpha", "10", "--name", "x", "--json", "--store", store
    )
    assert code == 0 and out["released"] is True and out["holds"] == []
    code, (out,) = json_out(
        capsys, "--store", store, "release", "alpha", "10", "--name", "x", "--json"
    )
    assert code == 1 and out["released"] is False


def test_restore_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = mouthguard.open_store(root, create=False)
    durable = Path(store.tier("durable").location("alpha/000000000020/"))
    for path in sorted(durable.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    durable.rmdir()
    args = ["--store", str(root), "restore", "alpha", "20", "--to", "durable", "--json"]
    code, (out,) = json_out(capsys, *args)
    assert code == 0
    assert out["outcome"] == "restored" and out["source"] == "fast" and out["nbytes"] > 0
    code, (out,) = json_out(capsys, *args)
    assert code == 0 and out["outcome"] == "already_valid" and out["source"] is None


def test_agent_json_lines(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, events = json_out(capsys, "--store", str(root), "agent", "--once", "--json")
    assert code == 0
    assert [e["event"] for e in events] == ["start", "pass", "stop"]
    start, one, stop = events
    assert start["tiers"] == [
        {"name": "fast", "domain": "local-fast"},
        {"name": "durable", "domain": "local-durable"},
    ]
    assert one["checked"] == 2 and one["protected"] == 2 and one["shortfalls"] == []
    assert stop == {"event": "stop", "passes": 1, "reason": "pass limit reached"}
