"""Peer memory beside the store: the node areas the page lists, as ``ls --peers`` does.

A store does not know where its jobs keep peer memory (a ``PeerMemory`` names
its own path), so ``mouthguard serve --peers [PATH]`` names it, and the page
reads the node areas under it on every request (directory listings and one
small manifest per step; nothing is written). Each row is one step held in
one node's area, as ``mouthguard ls --peers`` prints it, plus:

* ``complete`` -- the node holds the step's manifest; without one the step is
  a save in flight or an interrupted one, never loaded;
* ``world_size`` and ``missing`` -- from the step's manifest in any node that
  holds it complete, the ranks whose file no node holds; a step with none
  missing can be resumed from peer memory (``recoverable``).

At most :data:`MAX_ROWS` rows are returned (newest steps first), with the
total, so a node area that grew past its bound cannot make one request huge.
"""

from __future__ import annotations

import os
from typing import Any

from mouthguard.checkpoint.surface import NodeArea, node_areas, read_manifest
from mouthguard.errors import MouthguardError

__all__ = ["MAX_ROWS", "peer_memory"]

#: Rows returned at most (a node keeps a few steps per run: more means trouble).
MAX_ROWS = 500


def peer_memory(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The peer memory under ``path``: totals and one row per node and step (see the module)."""
    areas = node_areas(path)
    rows: list[dict[str, Any]] = []
    for area in areas:
        for run in area.runs():
            rows.extend(
                {
                    "node": area.domain,
                    "run": run,
                    "step": held.step,
                    "ranks": list(held.ranks),
                    "bytes": held.nbytes,
                    "complete": held.complete,
                }
                for held in area.held(run, partial=True)
            )
    _judge(rows, {a.domain: a for a in areas})
    rows.sort(key=lambda r: (r["run"], -r["step"], r["node"]))
    return {
        "path": str(path),
        "nodes": len(areas),
        "steps": len({(r["run"], r["step"]) for r in rows if r["complete"]}),
        "bytes": sum(r["bytes"] for r in rows),
        "total": len(rows),
        "rows": rows[:MAX_ROWS],
    }


def _judge(rows: list[dict[str, Any]], areas: dict[str, NodeArea]) -> None:
    """Add ``world_size``, ``missing`` and ``recoverable`` to every row, per (run, step)."""
    steps: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        steps.setdefault((row["run"], row["step"]), []).append(row)
    for (run, step), held in steps.items():
        world = _world_size(run, step, [areas[r["node"]] for r in held if r["complete"]])
        have = {rank for r in held if r["complete"] for rank in r["ranks"]}
        missing = None if world is None else [r for r in range(world) if r not in have]
        for row in held:
            row["world_size"] = world
            row["missing"] = missing
            row["recoverable"] = missing == []


def _world_size(run: str, step: int, holders: list[NodeArea]) -> int | None:
    """The step's world size from the first holder whose manifest reads; None if none does."""
    for area in holders:
        try:
            return read_manifest(area.tier, run, step).world_size
        except (MouthguardError, OSError):
            continue  # pruned meanwhile, or damaged: ask the next holder
    return None
