"""What ``import mouthguard`` loads: the storage core, never the CLI, demo, economics or chaos.

Those four are about a third of the source and bring their own dependencies
(matplotlib for plots, rich progress views, the demo's training job); a training
job that checkpoints pays for none of them. The layering test
(``tests/test_layers.py``) checks what each module's source names; this checks
what a fresh interpreter really has in ``sys.modules`` afterwards, so an import
hidden in a function called at import time, or a package ``__init__`` that
re-exports too much, is caught too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "mouthguard"
#: The storage core: everything `import mouthguard` may need.
CORE = ("errors", "tiers", "policy", "format", "config", "checkpoint", "jobs", "dcp")
#: Never loaded by the core: mouthguard's own upper layers, and plotting.
FORBIDDEN = (
    "mouthguard.cli",
    "mouthguard.demo",
    "mouthguard.plan",
    "mouthguard.chaos",
    "mouthguard.dashboard",
)
FORBIDDEN_THIRD_PARTY = ("matplotlib", "starlette", "uvicorn", "prometheus_client")

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
sys.stdout.write(json.dumps(sorted(sys.modules)))
"""


def loaded_after_importing(*modules: str) -> list[str]:
    """``sys.modules`` of a fresh interpreter after importing ``modules``."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def offenders(loaded: list[str]) -> list[str]:
    """The modules of ``loaded`` the core must not pull in."""
    names = (*FORBIDDEN, *FORBIDDEN_THIRD_PARTY)
    return [m for m in loaded if any(m == n or m.startswith(n + ".") for n in names)]


def core_modules() -> list[str]:
    """Every module of the storage core, as a dotted name."""
    found = []
    for layer in CORE:
        paths = [PACKAGE / f"{layer}.py"] if (PACKAGE / f"{layer}.py").exists() else []
        paths += sorted((PACKAGE / layer).rglob("*.py")) if (PACKAGE / layer).is_dir() else []
        for path in paths:
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_import_mouthguard_loads_only_the_core() -> None:
    loaded = loaded_after_importing("mouthguard")
    assert "mouthguard.checkpoint" in loaded  # the probe saw the package itself
    assert offenders(loaded) == []


def test_no_core_module_loads_an_upper_layer() -> None:
    modules = core_modules()
    assert "mouthguard.jobs.replicator" in modules and "mouthguard.config" in modules
    assert offenders(loaded_after_importing(*modules)) == []


def test_the_probe_would_see_an_offender() -> None:
    # Guards the test itself: the CLI's chaos command does load the chaos layer.
    loaded = loaded_after_importing("mouthguard.cli.chaos")
    assert "mouthguard.chaos" in offenders(loaded)
    assert "mouthguard.checkpoint" not in offenders(loaded)
