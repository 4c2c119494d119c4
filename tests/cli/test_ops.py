"""``mouthguard hold|release|importance|replicate|agent``: behaviour and exit codes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli import agent
from mouthguard.cli.main import main
from mouthguard.jobs.replicator import Replicator
from tests.checkpoint.helpers import flip_byte, step_path
from tests.cli.helpers import show_json
from tests.jobs.conftest import make_store


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich reads COLUMNS: wide enough that table cells are never cut."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def two_tier(tmp_path: Path) -> Path:
    """A store config with fast (node-a) + durable (node-b): run alpha steps 10, 20; beta 1."""
    store = make_store(tmp_path / "two", ("fast", "node-a"), ("durable", "node-b"))
    alpha = mouthguard.Checkpointer(store, "alpha", background=False)
    alpha.save(10, {"w": torch.ones(64)}, importance="routine")
    alpha.save(20, {"w": torch.ones(64) * 2}, importance="milestone")
    mouthguard.Checkpointer(store, "beta", background=False).save(1, {"x": torch.zeros(4)})
    return tmp_path / "two" / "mouthguard.toml"


def durable_has(config: Path, run: str, step: int) -> bool:
    return (config.parent / "durable" / run / f"{step:012d}" / "manifest.json").is_file()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mouthguard.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- hold / release / importance ---------------------------------------------------


def test_hold_and_release_show_in_ls_and_show(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(two_tier)
    assert main(["--store", store, "hold", "alpha", "10", "--name", "rc1", "--reason", "x"]) == 0
    assert "holds: rc1" in capsys.readouterr().out
    assert main(["--store", store, "hold", "alpha", "10"]) == 0
    assert show_json(two_tier, "alpha", 10, capsys)["holds"] == ["hold", "rc1"]
    assert main(["--store", store, "ls", "alpha"]) == 0
    assert "holds" in (out := capsys.readouterr().out) and "hold, rc1" in out
    assert main(["--store", store, "show", "alpha", "10"]) == 0
    assert "hold, rc1" in capsys.readouterr().out

    assert main(["--store", store, "release", "alpha", "10", "--name", "rc1"]) == 0
    assert "holds: hold" in capsys.readouterr().out
    assert main(["--store", store, "release", "alpha", "10"]) == 0
    assert show_json(two_tier, "alpha", 10, capsys)["holds"] == []


def test_release_of_a_missing_hold_exits_1(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(two_tier), "release", "alpha", "10", "--name", "nope"]) == 1
    assert "no hold 'nope' on alpha step 10" in capsys.readouterr().err


def test_importance_promotes_and_demotes(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(two_tier)
    assert main(["--store", store, "importance", "alpha", "10", "golden", "--reason", "rc"]) == 0
    out = capsys.readouterr().out
    assert "importance critical (saved as routine)" in out and "was routine" in out
    info = show_json(two_tier, "alpha", 10, capsys)
    assert (info["importance"], info["saved_importance"]) == ("critical", "routine")
    assert main(["--store", store, "show", "alpha", "10"]) == 0
    assert "saved importance" in capsys.readouterr().out
    assert main(["--store", store, "ls", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["importance"] for r in rows] == ["critical", "milestone", "routine"]

    assert main(["--store", store, "importance", "alpha", "10", "transient"]) == 0
    assert show_json(two_tier, "alpha", 10, capsys)["importance"] == "transient"
    assert main(["--store", store, "show", "alpha", "20"]) == 0
    assert "saved importance" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["hold", "alpha", "99"],
        ["hold", "nosuchrun", "10"],
        ["hold", "../etc", "10"],
        ["hold", "alpha", "10", "--name", "../x"],
        ["release", "alpha", "99"],
        ["release", "nosuchrun", "1"],
        ["importance", "alpha", "99", "critical"],
        ["importance", "alpha", "10", "precious"],
        ["importance", "nosuchrun", "10", "routine"],
        ["replicate", "nosuchrun"],
    ],
)
def test_unknown_targets_are_usage_errors(
    two_tier: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(two_tier), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["hold", "alpha", "notanumber"],
        ["agent", "--interval", "0"],
        ["agent", "--interval", "nan"],
        ["agent", "--max-passes", "0"],
    ],
)
def test_bad_arguments_exit_2(two_tier: Path, args: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--store", str(two_tier), *args])
    assert exited.value.code == 2


# --- replicate ---------------------------------------------------------------------


def test_replicate_copies_then_finds_everything_protected(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(two_tier), "replicate", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["checked"] == report["protected"] == 3
    copies = {(c["run"], c["step"], c["source"], c["destination"]) for c in report["copies"]}
    assert copies == {
        (r, s, "fast", "durable") for r, s in [("alpha", 10), ("alpha", 20), ("beta", 1)]
    }
    assert all(c["nbytes"] > 0 and c["seconds"] >= 0 for c in report["copies"])
    assert report["shortfalls"] == [] and report["unprotected"] == []
    assert durable_has(two_tier, "alpha", 20)

    assert main(["--store", str(two_tier), "replicate"]) == 0
    out = capsys.readouterr().out
    assert "3 checked, 3 protected, 0 copies" in out


def test_replicate_table_names_each_copy(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(two_tier), "replicate", "alpha"]) == 0
    out = capsys.readouterr().out
    assert out.count("fast -> durable") == 2 and "beta" not in out
    assert "2 checked, 2 protected, 2 copies" in out
    assert not durable_has(two_tier, "beta", 1)


def test_replicate_reports_an_unsatisfiable_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store(tmp_path / "one", ("fast", "rack"), ("durable", "rack"))
    mouthguard.Checkpointer(store, "r", background=False).save(5, {"w": torch.ones(8)})
    config = tmp_path / "one" / "mouthguard.toml"
    assert main(["--store", str(config), "replicate", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and (report["checked"], report["protected"]) == (1, 0)
    assert any("distinct failure domains" in s["reason"] for s in report["shortfalls"])
    assert report["unprotected"] and report["unprotected"][0].startswith("r step 5:")
    assert main(["--store", str(config), "replicate"]) == 1
    out = capsys.readouterr().out
    assert "shortfalls" in out and "not protected:" in out and "unsatisfiable" in out


def test_replicate_never_propagates_a_damaged_source(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = mouthguard.open_store(two_tier)
    flip_byte(step_path(store, "alpha", 20) / "rank-00000.safetensors", -1)
    assert main(["--store", str(two_tier), "replicate", "alpha", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [c["step"] for c in report["copies"]] == [10]
    reasons = [s["reason"] for s in report["shortfalls"] if s["step"] == 20]
    assert any("damaged" in r for r in reasons) and not durable_has(two_tier, "alpha", 20)


def test_replicate_on_an_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_store(tmp_path / "empty", ("fast", "a"), ("durable", "b"))
    assert main(["--store", str(tmp_path / "empty" / "mouthguard.toml"), "replicate"]) == 0
    assert "nothing to replicate" in capsys.readouterr().out


# --- agent -------------------------------------------------------------------------


def test_agent_once_runs_one_pass(two_tier: Path, capsys: pytest.CaptureFixture[str]) -> None:
    original = signal.getsignal(signal.SIGTERM)
    assert main(["--store", str(two_tier), "agent", "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0][:6] for line in lines[1:-1]] == ["pass 1"]
    assert "3 checked, 3 protected, 3 copies" in lines[1]
    assert lines[-1] == "agent stopped after 1 passes (pass limit reached)"
    assert durable_has(two_tier, "beta", 1)
    assert signal.getsignal(signal.SIGTERM) is original  # handlers restored


def test_agent_survives_a_failing_pass(
    two_tier: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Replicator, "replicate", broken)
    args = ["--store", str(two_tier), "agent", "--max-passes", "2", "--interval", "0.01"]
    assert main(args) == 0
    passes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pass")]
    assert len(passes) == 2 and all("FAILED: RuntimeError: disk on fire" in p for p in passes)


def test_agent_pass_budget_bounds_a_pass(
    two_tier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--store", str(two_tier), "agent", "--once", "--pass-budget", "1e-9"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("pass")]
    assert "0 checked" in line and "3 not reached" in line
    assert not durable_has(two_tier, "alpha", 10)


def test_agent_stops_on_sigint_after_the_pass_in_flight(
    two_tier: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands mid-pass (sent from the worker): the checkpoint in flight finishes,
    the rest of the pass and every later pass are skipped, and the exit is clean.

    The SIGINT can never reach pytest: around the agent, the test's own handler
    takes SIGINT (so a signal outside the agent's window is recorded, not a
    KeyboardInterrupt of the whole run), and once the agent has returned no
    worker can send another one.
    """
    original, original_signal = Replicator.replicate, agent._Stop.signal
    calls: list[tuple[str, int]] = []
    handled = threading.Event()  # only the handlers touch it: no lock held by main
    stray: list[int] = []  # SIGINTs that reached the test's guard instead of the agent
    sending = threading.Lock()
    armed = [True]

    def signal_seen(self: agent._Stop) -> None:
        original_signal(self)
        handled.set()

    def guard(signum: int, _frame: object) -> None:
        stray.append(signum)
        handled.set()

    def replicate_then_interrupt(self: Replicator, run: str, step: int, report: object) -> object:
        calls.append((run, step))
        done = original(self, run, step, report)
        with sending:
            if not armed[0]:
                return done  # the agent has returned: nobody of ours is listening
            os.kill(os.getpid(), signal.SIGINT)
        # The handler runs in the main thread; wait for it so the test is not a race.
        assert handled.wait(10)
        return done

    monkeypatch.setattr(agent._Stop, "signal", signal_seen)
    monkeypatch.setattr(Replicator, "replicate", replicate_then_interrupt)
    previous = signal.signal(signal.SIGINT, guard)
    try:
        # An interval of an hour: returning at all shows the stop cut the wait short.
        assert main(["--store", str(two_tier), "agent", "--interval", "3600"]) == 0
    finally:
        with sending:
            armed[0] = False
        signal.signal(signal.SIGINT, previous)
    assert stray == []  # the one SIGINT reached the agent's handler
    assert len(calls) == 1
    out = capsys.readouterr().out
    assert "2 not reached" in out and "(stop requested)" in out


def test_stop_sleep_ends_when_requested() -> None:
    stop = agent._Stop()
    threading.Timer(0.05, stop.signal).start()
    stop.sleep(3600)  # an hour unless the stop cuts it short
    assert stop.requested and not stop.forced
    stop.sleep(3600)  # already requested: returns at once
    stop.signal()
    assert stop.forced


def test_agent_subprocess_max_passes(two_tier: Path) -> None:
    result = cli("--store", str(two_tier), "agent", "--max-passes", "2", "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    passes = [line for line in result.stdout.splitlines() if line.startswith("pass")]
    assert len(passes) == 2
    assert "3 copies" in passes[0] and "0 copies" in passes[1]
    assert "Traceback" not in result.stderr
    assert durable_has(two_tier, "alpha", 10)


def test_agent_subprocess_exits_0_on_sigterm(two_tier: Path) -> None:
    args = ["--store", str(two_tier), "agent", "--interval", "3600"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mouthguard.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not lines.get(timeout=max(0.1, deadline - time.monotonic())).startswith("pass 1"):
            pass
        # The agent now sleeps its hour-long interval: only SIGTERM cutting it short
        # ends the process within the wait.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    reader.join(timeout=10)  # the pipe is at EOF once the process is gone
    rest = [lines.get() for _ in range(lines.qsize())]
    assert rest[-1].strip() == "agent stopped after 1 passes (stop requested)"
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
