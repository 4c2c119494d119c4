"""Traces in the public Mooncake format, and a synthetic generator for them.

Mooncake's released traces are JSON lines ``{"timestamp", "input_length",
"output_length", "hash_ids"}``: ``hash_ids`` name the request's 512-token blocks,
already chained (equal ids mean an equal prefix up to and including that block).
No real trace can be fetched offline here, so :func:`synthetic` writes one of the
same shape: multi-round chat sessions (each round resends the whole history plus
a new turn) whose sessions are chosen with Zipf popularity, each session opened
by one of a few system prompts, also Zipf-popular.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Request:
    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


def synthetic(
    requests: int, *, seed: int = 0, sessions: int = 200, system_prompts: int = 8
) -> list[Request]:
    """A multi-round, Zipf-shared-prefix trace (see the module docstring)."""
    rng = np.random.default_rng(seed)
    next_id = iter(range(1, 1 << 40))
    prompts = [
        [next(next_id) for _ in range(int(rng.integers(2, 9)))] for _ in range(system_prompts)
    ]
    history: dict[int, list[int]] = {}
    out = []
    clock = 0
    for _ in range(requests):
        session = int(min(rng.zipf(1.2), sessions)) - 1
        if session not in history or len(history[session]) > 60:  # new or too long: restart
            prompt = prompts[int(min(rng.zipf(1.5), system_prompts)) - 1]
            history[session] = list(prompt)
        turn = [next(next_id) for _ in range(int(rng.integers(1, 5)))]
        ids = history[session] + turn
        history[session] = [*ids, next(next_id)]  # the answer joins the history
        clock += int(rng.integers(50, 500))
        length = len(ids) * MOONCAKE_BLOCK_TOKENS - int(rng.integers(0, MOONCAKE_BLOCK_TOKENS))
        out.append(Request(clock, length, int(rng.integers(50, 600)), ids))
    return out


def write(path: Path, trace: list[Request]) -> None:
    with path.open("w") as f:
        for r in trace:
            f.write(json.dumps(r.__dict__) + "\n")


def read(path: Path) -> list[Request]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.append(
                Request(
                    int(row["timestamp"]),
                    int(row["input_length"]),
                    int(row["output_length"]),
                    [int(h) for h in row["hash_ids"]],
                )
            )
    return out


def ideal_lru_hit_rate(trace: list[Request], capacity_blocks: int) -> float:
    """Block hit rate of an exact LRU holding ``capacity_blocks`` blocks (offline).

    Like the stores, a request hits the longest prefix present and then stores
    every block it lacks; all blocks it touches become most recent.
    """
    lru: OrderedDict[tuple[int, ...], None] = OrderedDict()
    hits = total = 0
    for r in trace:
        keys = [tuple(r.hash_ids[: i + 1]) for i in range(len(r.hash_ids))]
        covered = 0
        while covered < len(keys) and keys[covered] in lru:
            covered += 1
        hits += covered
        total += len(keys)
        for key in keys:
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hits / total if total else 0.0
