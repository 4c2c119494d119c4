"""The package's layers, enforced: data flows framework -> checkpoint -> policy -> tiers.

* ``tiers`` import nothing above them (only ``errors`` and each other).
* ``policy`` and ``plan`` are pure: no I/O layer, no tiers, no torch I/O.
* ``format`` knows nothing of checkpoints, tiers' implementations or the CLI.
* ``jobs`` move copies between tiers on the policy's word; nothing below imports them.
* nothing but the CLI imports the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "mouthguard"

#: layer -> mouthguard sub-packages/modules it may import
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "tiers": {"errors", "tiers"},
    "policy": {"errors", "policy"},
    "format": {"errors", "format", "policy", "tiers"},  # tiers.keys for name validation only
    "config": {"errors", "tiers", "policy"},
    "checkpoint": {"errors", "format", "policy", "tiers", "config", "checkpoint"},
    "jobs": {"errors", "format", "policy", "tiers", "config", "checkpoint", "jobs"},
    # The DCP storage plugins: an adapter above checkpoint (its commit protocol and
    # verified reads); the writer wakes the background service after a commit.
    "dcp": {"errors", "format", "policy", "tiers", "config", "checkpoint", "jobs", "dcp"},
    # The economics (sizing, intervals, the simulator): pure arithmetic and plots.
    "plan": {"errors", "plan"},
    "demo": {"errors", "format", "policy", "tiers", "config", "checkpoint", "jobs", "demo"},
    # Datasets: shards, manifests (signed as checkpoints are), the cache and the loader.
    "data": {"errors", "format", "tiers", "data"},
    "cli": {
        "errors",
        "format",
        "policy",
        "tiers",
        "config",
        "checkpoint",
        "jobs",
        "demo",
        "plan",
        "data",
        "cli",
    },
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mouthguard" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] == "mouthguard":
                found.add("__init__")
    return found


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if _layer(p) in ALLOWED)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_respects_its_layer(path: Path) -> None:
    layer = _layer(path)
    imported = _imports(path) - {layer}
    # The writer records mouthguard.__version__ lazily; importing the top package for
    # that one attribute is allowed in checkpoint only.
    if layer == "checkpoint":
        imported.discard("__init__")
    # The Checkpointer starts the store's background service (a lazy, call-time
    # import); no other checkpoint module may reach up into jobs.
    if path.name == "checkpointer.py":
        imported.discard("jobs")
    illegal = imported - ALLOWED[layer]
    assert not illegal, f"{path.relative_to(PACKAGE)} ({layer}) imports {sorted(illegal)}"


def test_every_layer_is_known() -> None:
    layers = {_layer(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert layers <= set(ALLOWED), f"unknown layers {layers - set(ALLOWED)}: add them to ALLOWED"


def test_policy_is_pure() -> None:
    for path in (PACKAGE / "policy").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert not modules & {"os", "io", "shutil", "socket", "subprocess", "torch", "pathlib"}, (
            path
        )
