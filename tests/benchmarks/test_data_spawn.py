"""The benchmark's two ways to start a child behave alike: output, environment, group, timeout."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.data import spawn

REPO = Path(__file__).parents[2]
TARGET = "tests.benchmarks.spawn_target"


@pytest.fixture(scope="module")
def preloaded() -> Iterator[spawn.PreloadedChildren]:
    # One zygote for the module: it imports torch once (seconds), as in a --quick run.
    launcher = spawn.PreloadedChildren(REPO, child_env(), module=TARGET)
    yield launcher
    launcher.close()


@pytest.fixture(params=["fresh", "preloaded"])
def launcher(request: pytest.FixtureRequest) -> spawn.Launcher:
    if request.param == "fresh":
        return spawn.FreshChildren(REPO, module=TARGET)
    found: spawn.Launcher = request.getfixturevalue("preloaded")
    return found


def child_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **extra}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_gets_its_argv_its_env_only_its_own_session_and_no_stdin(
    launcher: spawn.Launcher,
) -> None:
    done = launcher.run(["report", "x y"], child_env(CELL="7"), timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["report", "x y"]
    assert seen["env"]["CELL"] == "7"
    assert "PYTEST_CURRENT_TEST" not in seen["env"]  # the given env replaces the parent's
    assert seen["own_session"]
    assert seen["stdin"] == ""
    assert done.stderr.strip() == "a line on stderr"


def test_only_the_preloaded_child_starts_with_torch_imported(launcher: spawn.Launcher) -> None:
    done = launcher.run(["report"], child_env(), timeout=60)
    assert json.loads(done.stdout)["torch_imported"] is isinstance(
        launcher, spawn.PreloadedChildren
    )


FAILURES = [("refuse", "refused: why not"), ("crash", "RuntimeError: the child broke")]


@pytest.mark.parametrize(("command", "said"), FAILURES)
def test_a_failing_child_exits_1_and_says_why_on_stderr(
    launcher: spawn.Launcher, command: str, said: str
) -> None:
    done = launcher.run([command], child_env(), timeout=60)
    assert done.returncode == 1
    assert said in done.stderr
    assert done.stdout == ""


def test_a_child_past_its_timeout_is_killed_with_its_group_and_the_next_one_runs(
    launcher: spawn.Launcher, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild"
    done = launcher.run(["hang", str(pidfile)], child_env(), timeout=3)
    assert done.returncode is None  # killed at its timeout (it sleeps 600 s otherwise)
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)
    again = launcher.run(["report"], child_env(), timeout=60)
    assert again.returncode == 0


def test_kill_from_another_thread_ends_the_running_child(
    launcher: spawn.Launcher, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild"

    def kill_when_started() -> None:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.kill()

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    done = launcher.run(["hang", str(pidfile)], child_env(), timeout=120)
    killer.join()
    assert done.returncode == -9


def test_a_closed_preloaded_launcher_starts_a_new_zygote_when_used_again() -> None:
    launcher = spawn.PreloadedChildren(REPO, child_env(), module=TARGET)
    try:
        assert launcher.run(["report"], child_env(), timeout=60).returncode == 0
        first = launcher.zygote
        assert first is not None
        launcher.close()
        assert first.poll() is not None  # the zygote ended with its stdin
        assert launcher.run(["report"], child_env(), timeout=60).returncode == 0
    finally:
        launcher.close()
    assert not launcher.scratch.exists()


def test_a_zygote_that_dies_under_a_child_is_an_error_and_the_child_goes_too(
    tmp_path: Path,
) -> None:
    launcher = spawn.PreloadedChildren(REPO, child_env(), module=TARGET)
    pidfile = tmp_path / "grandchild"

    def kill_zygote_when_started() -> None:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert launcher.zygote is not None
        launcher.zygote.kill()

    killer = threading.Thread(target=kill_zygote_when_started)
    try:
        killer.start()
        with pytest.raises(spawn.ZygoteError, match="the zygote ended"):
            launcher.run(["hang", str(pidfile)], child_env(), timeout=120)
        killer.join()
        grandchild = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(grandchild)
        # the next run starts another zygote
        assert launcher.run(["report"], child_env(), timeout=60).returncode == 0
    finally:
        launcher.close()
