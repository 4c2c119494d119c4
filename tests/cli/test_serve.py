"""``mouthguard serve``: a real process serving on loopback, and its usage errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.cli.common import EXIT_USAGE
from mouthguard.cli.main import main


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    mouthguard.Checkpointer(path, "r", background=False).save(1, {"w": torch.ones(4)})
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "status"),
    [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)],  # 130: main's EXIT_INTERRUPTED
)
def test_serves_until_stopped_by_a_signal(store_path: Path, stop: int, status: int) -> None:
    """Shut down gracefully, then end as the signal asks (uvicorn raises it again)."""
    command = [sys.executable, "-m", "mouthguard.cli.main", "--store", str(store_path)]
    process = subprocess.Popen(
        [*command, "serve", "--port", "0", "--peers", str(store_path.parent / "shm")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens
        assert "(1 checkpoints" in line and "(read-only)" in line, line
        url = line.split(" on ")[1].split(" ")[0]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/api/summary", timeout=60) as response:
            summary = json.loads(response.read())
        assert summary["checkpoints"] == 1
        assert summary["peers"] == str(store_path.parent / "shm")  # the page's peer memory
    finally:
        process.send_signal(stop)
        _, err = process.communicate(timeout=60)
    assert process.returncode == status, err
    assert "Traceback" not in err


def test_mutations_need_a_token(
    store_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOUTHGUARD_SERVE_TOKEN", "short")
    assert main(["--store", str(store_path), "serve", "--allow-mutations"]) == EXIT_USAGE
    assert "a token of at least 16 characters in $MOUTHGUARD_SERVE_TOKEN" in capsys.readouterr().err


def test_without_the_extra_says_what_to_install(
    store_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m.startswith(("starlette", "mouthguard.dashboard"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)  # as if it were not installed
    assert main(["--store", str(store_path), "serve", "--port", "0"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "error: serve needs the web stack, an optional extra: pip install 'mouthguard[serve]'\n"
    )


def test_a_port_in_use_is_a_usage_error(
    store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mouthguard.dashboard.server import bind  # noqa: PLC0415

    with bind("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        assert main(["--store", str(store_path), "serve", "--port", str(port)]) == EXIT_USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_a_port_out_of_range_is_a_usage_error(
    store_path: Path, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--store", str(store_path), "serve", "--port", port])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument --port: must be an integer >= 0 and <= 65535: '{port}'" in err
    assert "Traceback" not in err


def test_no_store_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store", str(tmp_path / "none"), "serve"]) == EXIT_USAGE
    assert "no store" in capsys.readouterr().err
