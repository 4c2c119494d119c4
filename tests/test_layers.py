"""The package's layers, enforced: data flows framework -> checkpoint -> policy -> tiers.

* ``tiers`` import nothing above them (only ``errors``, ``pathsafety``, ``clock``
  and the low half of ``io``).
* ``io`` is two levels: its pool and direct I/O sit below the tiers (the local and
  KV disk tiers build on them); ``io.read_ahead`` and ``io.host_ring`` read from a
  ``Tier`` and so sit above the tiers and below checkpoints and weights. Each of
  those two modules is a layer of its own in :data:`ALLOWED`.
* ``policy`` and ``plan`` are pure: no I/O layer, no tiers, no torch I/O.
* ``format`` knows nothing of checkpoints, tiers' implementations or the CLI.
* ``jobs`` move copies between tiers on the policy's word; nothing below imports them
  (``checkpoint`` reports to them through ``checkpoint/listeners.py``, which
  ``wiring`` connects).
* nothing but the CLI imports the CLI.
* ``data``'s subpackages are layers of their own: ``formats`` at the bottom, then
  writing, fetching, reading, indexing, and the torch side (``loading``) on top.
* no two modules import each other, directly or through others: the import graph
  of ``src/mouthguard`` has no cycle at all, inside a layer included.

Every ``import`` counts wherever it stands: at module level, inside a function
(a "lazy" import is still a dependency) or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "mouthguard"
ROOT = "mouthguard"

#: The modules of ``io`` that read from a tier: above ``tiers``, unlike the rest of ``io``.
IO_ABOVE_TIERS = {"io.read_ahead", "io.host_ring"}

#: Lower layers everything may build on (a new layer usually needs these).
_BASE = {
    "errors",
    "version",
    "pathsafety",
    "clock",
    "io",
    "format",
    "policy",
    "tiers",
    "config",
} | IO_ABOVE_TIERS

#: What the parts of ``data`` build on outside it (``io``: its low half, below the tiers --
#: the lock files a forked DataLoader worker lets go of).
_DATA_BELOW = {"errors", "pathsafety", "io", "format", "tiers"}
#: The parts of ``data``: its subpackages, and the modules beside them with rules of their own.
_DATA = {
    "data",
    "data.formats",
    "data.location",
    "data.burst",
    "data.dataset",
    "data.writing",
    "data.fetching",
    "data.reading",
    "data.indexing",
    "data.verify",
    "data.loading",
}

#: layer -> mouthguard sub-packages/modules it may import. A layer is the first
#: component under ``mouthguard`` (a sub-package or a top-level module), or a
#: dotted path below it listed here, which gives those modules rules of their own
#: (the longest listed path wins); add a new one here with the layers below it.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    # Time as a parameter (monotonic, sleep, timed waits): imports nothing of mouthguard.
    "clock": set(),
    # The one I/O pool and direct I/O: below the tiers that build on them.
    "io": {"errors", "clock", "io"},
    # Parallel ranged reads from a Tier, in file order.
    "io.read_ahead": {"errors", "tiers", "io"},
    # Host buffers between a tier and a device (format.rank_file for byte views).
    "io.host_ring": {"errors", "format", "tiers", "io", "io.read_ahead"},
    # The distribution's version (``importlib.metadata``): below everything.
    "version": set(),
    # The one rule for names that become paths or keys: every validator builds on it.
    "pathsafety": set(),
    "tiers": {"errors", "pathsafety", "clock", "io", "tiers"},
    "policy": {"errors", "policy"},
    # tiers.object_keys for name validation only
    "format": {"errors", "pathsafety", "format", "policy", "tiers"},
    "config": {"errors", "tiers", "policy"},
    "checkpoint": _BASE | {"checkpoint"},
    "jobs": _BASE | {"checkpoint", "jobs"},
    # The DCP storage plugins: an adapter above checkpoint (its commit protocol and
    # verified reads); replication hears of its commits through the store's listener.
    "dcp": _BASE | {"checkpoint", "dcp"},
    # The composition root: installs the jobs' background service as the listener
    # of every store (the only module that joins checkpoint and jobs).
    "wiring": {"checkpoint", "jobs", "wiring"},
    # The economics (sizing, intervals, the simulator): pure arithmetic and plots.
    "plan": {"errors", "plan"},
    # The kit for tier authors: above tiers only.
    "testing": {"errors", "pathsafety", "tiers", "testing"},
    # Datasets: shards, manifests (signed as checkpoints are), the cache and the loader.
    # The package's __init__ exports from every part; each part names the parts below it.
    "data": _DATA_BELOW | _DATA,
    # What a dataset is on a tier, and the parsers of its formats: no other part of data.
    "data.formats": _DATA_BELOW | {"data.formats"},
    "data.location": _DATA_BELOW | {"data.location"},
    "data.burst": set(),
    "data.dataset": _DATA_BELOW | {"data.formats", "data.location", "data.dataset"},
    "data.writing": _DATA_BELOW | {"data.formats", "data.location", "data.writing"},
    "data.fetching": _DATA_BELOW
    | {"data.formats", "data.location", "data.dataset", "data.burst", "data.fetching"},
    "data.reading": _DATA_BELOW | {"data.formats", "data.fetching", "data.reading"},
    # Indexing in place reads the user's files as the readers do (gzip tars, ranges).
    "data.indexing": _DATA_BELOW
    | {"data.formats", "data.location", "data.dataset", "data.fetching", "data.reading"}
    | {"data.indexing"},
    # Verifying re-indexes what it reads and compares (adopted datasets).
    "data.verify": _DATA_BELOW | (_DATA - {"data", "data.writing", "data.loading"}),
    # The torch side: above every part that reads.
    "data.loading": _DATA_BELOW
    | (_DATA - {"data", "data.writing", "data.indexing", "data.verify"}),
    # KV-cache blocks for inference: transient state over memory, disk and any tier;
    # format.signing only for the store key that MACs remote objects.
    "kvcache": {"errors", "pathsafety", "io", "format", "policy", "tiers", "kvcache"},
    # Trainer and engine plug-ins (Lightning, Hugging Face, vLLM): adapters above
    # checkpoint, as dcp is, and above the KV store and the weights loader (vLLM).
    "integrations": _BASE | {"checkpoint", "kvcache", "weights", "integrations"},
    # Inference cold start: weights files (HF directories, checkpoints) into device memory,
    # through the checkpoint layer's verified manifests, read-ahead and host ring.
    "weights": _BASE | {"checkpoint", "weights"},
    # Built-in semantic checks of a loaded or saved state (they look at tensors).
    "checks": _BASE | {"checkpoint", "checks"},
    "demo": _BASE | {"checkpoint", "checks", "jobs", "demo"},
    # Fault injection judged through clean tiers (`mouthguard chaos`): an exercise above jobs.
    "chaos": _BASE | {"checkpoint", "jobs", "chaos"},
    # The operator's web page and metrics: reads what checkpoint, jobs (the retention
    # plan) and data describe; the CLI's `serve` starts it.
    "dashboard": _BASE | {"checkpoint", "jobs", "dashboard"} | _DATA,
    "cli": _BASE
    | {"checkpoint", "jobs", "demo", "plan", "chaos", "weights", "dashboard", "cli"}
    | _DATA,
}


# --- the import graph -------------------------------------------------------------------


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    """``mouthguard.checkpoint.store`` for ``.../checkpoint/store.py`` (packages by their name)."""
    parts = [ROOT, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, package: Path) -> bool:
    """Whether ``name`` (dotted, under mouthguard) is a module or package in ``package``."""
    rel = Path(*name.split(".")[1:])
    return (package / rel).with_suffix(".py").is_file() or (package / rel / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(tree: ast.AST, importer: str, is_package: bool, package: Path) -> set[str]:
    """The mouthguard modules ``tree`` imports, anywhere in it (functions included).

    ``from mouthguard.x import y`` depends on the module ``mouthguard.x.y`` when
    ``y`` is a submodule, else on ``mouthguard.x`` itself. A parent package that
    Python runs on the way (``mouthguard/__init__.py``) is not counted: every
    module would otherwise depend on the top-level package.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, importer, is_package)
            if module.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if _is_module(submodule, package) else module)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the mouthguard modules it imports, for every module of the package."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        name = _module_name(path, package)
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = _targets(tree, name, path.name == "__init__.py", package) - {name}
    return graph


def strongly_connected(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative; sorted members)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycle_in(graph: Mapping[str, Set[str]], component: list[str]) -> list[str]:
    """One cycle through ``component`` (a strongly connected set), as ``[a, b, ..., a]``."""
    members = set(component)
    start = component[0]
    # Breadth-first from start's successors back to start, inside the component.
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in members or child in previous:
                    continue
                previous[child] = node
                if child == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(previous[path[-1]])
                    return path[::-1]
                following.append(child)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """One example cycle per strongly connected component of more than one module."""
    return [cycle_in(graph, c) for c in strongly_connected(graph) if len(c) > 1]


GRAPH = import_graph()


#: Cycles whose removal is on its way from another branch, each the exact set of
#: modules of its component. Delete an entry once its fix is merged:
#: test_pending_cycles_are_still_pending fails then, so none outlives its fix.
PENDING_CYCLES: list[set[str]] = []


def test_the_import_graph_has_no_cycle() -> None:
    found = [c for c in cycles(GRAPH) if set(c) not in PENDING_CYCLES]
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_pending_cycles_are_still_pending() -> None:
    components = [set(c) for c in strongly_connected(GRAPH)]
    fixed = [sorted(p) for p in PENDING_CYCLES if p not in components]
    assert not fixed, f"no longer a cycle, delete it from PENDING_CYCLES: {fixed}"


def test_the_cycle_check_can_fail() -> None:
    toy = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},  # a -> b -> c -> a
        "d": set(),
        "e": {"f"},
        "f": {"e"},  # e <-> f
        "g": {"a"},  # reaches the cycle, is not on it
    }
    assert sorted(map(sorted, (c for c in strongly_connected(toy) if len(c) > 1))) == [
        ["a", "b", "c"],
        ["e", "f"],
    ]
    assert sorted(cycles(toy)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    pkg = tmp_path / ROOT
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from mouthguard.low.leaf import thing\n")
    (pkg / "low" / "leaf.py").write_text(
        "def f():\n    from mouthguard import high  # lazy, still a dependency\n"
    )
    (pkg / "high.py").write_text("from .low import leaf\nfrom mouthguard.low import thing\n")
    graph = import_graph(pkg)
    assert graph["mouthguard.low.leaf"] == {"mouthguard.high"}
    assert graph["mouthguard.high"] == {"mouthguard.low.leaf", "mouthguard.low"}
    assert cycles(graph) == [["mouthguard.high", "mouthguard.low.leaf", "mouthguard.high"]]


def test_the_graph_is_not_empty() -> None:
    # A broken resolver would find nothing and pass every other test.
    assert "mouthguard.checkpoint.store" in GRAPH["mouthguard.checkpoint.checkpointer"]
    assert "mouthguard.checkpoint.catalog" in GRAPH["mouthguard.checkpoint.checkpointer"]


# --- the layers -----------------------------------------------------------------------


def _layer_of(module: str) -> str:
    """``checkpoint`` for ``mouthguard.checkpoint.store``; ``__init__`` for the package.

    A module that :data:`ALLOWED` names by a longer path (``io.host_ring``) is
    that layer: the longest listed path it is or lies under wins.
    """
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    for end in range(len(parts), 2, -1):
        candidate = ".".join(parts[1:end])
        if candidate in ALLOWED:
            return candidate
    return parts[1]


def _layer(path: Path) -> str:
    return _layer_of(_module_name(path))


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if _layer(p) in ALLOWED)


def _illegal_layers(module: str, targets: Set[str]) -> set[str]:
    """The layers ``module`` imports from ``targets`` that its own layer may not."""
    layer = _layer_of(module)
    return {_layer_of(t) for t in targets} - {layer} - ALLOWED[layer]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_respects_its_layer(path: Path) -> None:
    illegal = _illegal_layers(_module_name(path), GRAPH[_module_name(path)])
    assert not illegal, f"{path.relative_to(PACKAGE)} ({_layer(path)}) imports {sorted(illegal)}"


def test_io_is_split_around_the_tiers() -> None:
    # The low half of io sits below the tiers, the half that reads a Tier above them.
    assert _layer_of("mouthguard.io.direct_write") == "io"
    assert _layer_of("mouthguard.io.host_ring") == "io.host_ring"
    assert not _illegal_layers("mouthguard.tiers.local", {"mouthguard.io.direct_read"})
    assert _illegal_layers("mouthguard.tiers.local", {"mouthguard.io.read_ahead"}) == {
        "io.read_ahead"
    }
    assert _illegal_layers("mouthguard.io.pool", {"mouthguard.tiers.base"}) == {"tiers"}
    assert _illegal_layers("mouthguard.io.direct_read", {"mouthguard.io.host_ring"}) == {
        "io.host_ring"
    }
    assert not _illegal_layers("mouthguard.io.host_ring", {"mouthguard.io.read_ahead"})


def test_the_parts_of_data_are_layers() -> None:
    # Each subpackage of data (and each module beside them with rules of its own) is
    # a layer: formats build on no other part, the readers on the cache, not upward.
    assert _layer_of("mouthguard.data.formats.manifest") == "data.formats"
    assert _layer_of("mouthguard.data.fetching.cache") == "data.fetching"
    assert _layer_of("mouthguard.data.dataset") == "data.dataset"
    assert _layer_of("mouthguard.data") == "data"
    assert _illegal_layers(
        "mouthguard.data.formats.manifest", {"mouthguard.data.fetching.cache"}
    ) == {"data.fetching"}
    assert _illegal_layers(
        "mouthguard.data.fetching.fetch", {"mouthguard.data.reading.tarread"}
    ) == {"data.reading"}
    assert _illegal_layers(
        "mouthguard.data.writing.writer", {"mouthguard.data.loading.stream"}
    ) == {"data.loading"}
    assert not _illegal_layers(
        "mouthguard.data.loading.stream", {"mouthguard.data.reading.tarread"}
    )
    every = {p.relative_to(PACKAGE).parts[1] for p in (PACKAGE / "data").glob("*/__init__.py")}
    assert {f"data.{name}" for name in every} <= set(ALLOWED)


def test_every_layer_is_known() -> None:
    layers = {_layer(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert layers <= set(ALLOWED), f"unknown layers {layers - set(ALLOWED)}: add them to ALLOWED"


def test_nothing_imports_the_top_level_package() -> None:
    # mouthguard/__init__.py is the public facade above every layer.
    importers = sorted(m for m, targets in GRAPH.items() if ROOT in targets)
    assert not importers, f"{importers} import the top-level package"


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


# --- adapters use the checkpoint layer's public surface ---------------------------------

#: Layers that adapt mouthguard to something outside it (trainers, engines, operators).
ADAPTERS = {"integrations", "dashboard"}
#: The one checkpoint module they may import.
CHECKPOINT_SURFACE = "mouthguard.checkpoint.surface"


def _checkpoint_imports_beside_the_surface(graph: Mapping[str, Set[str]]) -> dict[str, list[str]]:
    return {
        module: sorted(bad)
        for module, targets in graph.items()
        if _layer_of(module) in ADAPTERS
        for bad in [{t for t in targets if _layer_of(t) == "checkpoint"} - {CHECKPOINT_SURFACE}]
        if bad
    }


def test_adapters_import_checkpoints_only_through_the_surface() -> None:
    """``integrations`` and ``dashboard`` reach checkpoints through ``checkpoint/surface.py``.

    What an adapter needs is added there, so the rest of the checkpoint layer
    stays free to change without breaking a trainer plug-in or the page.
    """
    found = _checkpoint_imports_beside_the_surface(GRAPH)
    assert not found, f"adapters importing checkpoint modules beside the surface: {found}"


def test_the_surface_rule_can_fail() -> None:
    toy = {
        "mouthguard.integrations.hf": {CHECKPOINT_SURFACE, "mouthguard.checkpoint.sidecars"},
        "mouthguard.dashboard.app": {CHECKPOINT_SURFACE, "mouthguard.tiers.base"},
        "mouthguard.cli.ls": {"mouthguard.checkpoint.sidecars"},  # not an adapter
    }
    assert _checkpoint_imports_beside_the_surface(toy) == {
        "mouthguard.integrations.hf": ["mouthguard.checkpoint.sidecars"]
    }


# --- the S3 tier is used through its package --------------------------------------------

#: The S3 tier's package; its modules (connection, control plane, probe, create
#: guards, versions, parts) are its own business.
S3_PACKAGE = "mouthguard.tiers.s3"


def _s3_internals_imported_from_outside(graph: Mapping[str, Set[str]]) -> dict[str, list[str]]:
    inside = f"{S3_PACKAGE}."
    return {
        module: sorted(bad)
        for module, targets in graph.items()
        if module != S3_PACKAGE and not module.startswith(inside)
        for bad in [{t for t in targets if t.startswith(inside)}]
        if bad
    }


def test_the_s3_tier_is_imported_only_through_its_package() -> None:
    """Everything outside ``tiers/s3/`` imports ``mouthguard.tiers.s3`` and nothing below it.

    What a caller needs (``S3Tier``, ``S3Probe``, ``CreateGuard``, ``warm_up``) is
    re-exported there, so the package can be regrouped without touching its callers.
    """
    found = _s3_internals_imported_from_outside(GRAPH)
    assert not found, f"modules importing S3 internals beside the package: {found}"


def test_the_s3_rule_can_fail() -> None:
    toy = {
        "mouthguard.data.location": {S3_PACKAGE},
        "mouthguard.data.loading.worker_preload": {"mouthguard.tiers.s3.connect"},
        "mouthguard.tiers.s3.tier": {"mouthguard.tiers.s3.connect"},  # inside: allowed
    }
    assert _s3_internals_imported_from_outside(toy) == {
        "mouthguard.data.loading.worker_preload": ["mouthguard.tiers.s3.connect"]
    }
