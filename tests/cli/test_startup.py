"""Commands that never touch tensors start without importing torch or matplotlib.

Importing torch takes about two seconds and matplotlib about half of one (and
prints a cache warning where HOME is not writable), so ``--help``, listing and
verifying must not pull them in. Checked in a fresh interpreter: the test
process itself has torch loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mouthguard

HEAVY = ("torch", "matplotlib")
# Runs one command in-process, then reports which heavy modules it loaded (on stderr,
# so the command's own output stays apart).
_PROBE = """
import json, sys
from mouthguard.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\nLOADED " + json.dumps([m for m in {heavy!r} if m in sys.modules]))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup") / "store"
    ckpt = mouthguard.Checkpointer(root, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(4)}, importance="milestone")
    return root


def loaded_by(*args: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after ``mouthguard ARGS``."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MOUTHGUARD_STORE": "/nonexistent"},
        check=False,
    )
    marker = result.stderr.rpartition("\nLOADED ")[2]
    loaded: list[str] = json.loads(marker)
    return loaded


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["ls", "--help"],
        ["plan", "llama3-70b", "--json"],
        ["simulate", "--runs", "1", "--json"],
    ],
    ids=" ".join,
)
def test_commands_without_a_store_import_neither(args: list[str]) -> None:
    assert loaded_by(*args) == []


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["ls", "--json"],
        ["show", "r", "1"],
        ["verify"],
        ["scrub"],
        ["gc"],
        ["doctor"],
        ["hold", "r", "1"],
        ["release", "r", "1"],
        ["promote", "r", "1", "critical"],
        ["replicate"],
        ["restore", "r", "1", "--to", "durable"],
    ],
    ids=" ".join,
)
def test_store_commands_import_neither(store: Path, args: list[str]) -> None:
    assert loaded_by("--store", str(store), *args) == []
