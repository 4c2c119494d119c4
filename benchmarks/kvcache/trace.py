"""Traces in the public Mooncake format, and a synthetic generator for them.

Mooncake's released traces are JSON lines ``{"timestamp", "input_length",
"output_length", "hash_ids"}``: ``hash_ids`` name the request's 512-token blocks,
already chained (equal ids mean an equal prefix up to and including that block).
No real trace can be fetched offline here, so two generators write traces of the
same shape (``--trace FILE`` replays a real one):

* :func:`synthetic` ("chat"): multi-round chat sessions (each round resends the
  whole history plus a new turn) chosen with Zipf popularity, each opened by one
  of a few Zipf-popular system prompts. Reuse is high (an ideal LRU hits ~0.9).
* :func:`conversation`: shaped after Mooncake's released conversation trace as
  its published figures describe it (4,000 requests, ~26 blocks each, one block
  shared by every request, an ideal LRU hit rate of ~0.3 at 26,624 blocks): most
  requests open a new conversation with a long unique prompt, about one in six
  continues a recent one. Reuse is low, so puts dominate the replay.
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
    requests: int,
    *,
    seed: int = 0,
    sessions: int = 200,
    system_prompts: int = 8,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    max_blocks: int = 60,
) -> list[Request]:
    """A multi-round, Zipf-shared-prefix trace (see the module docstring).

    ``block_tokens`` is the tokens per hash id (Mooncake's 512 unless an engine's
    block size is wanted); a session whose history passes ``max_blocks`` blocks
    starts over, so no request has more than ``max_blocks + 4`` blocks.
    """
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
        if session not in history or len(history[session]) > max_blocks:  # restart
            prompt = prompts[int(min(rng.zipf(1.5), system_prompts)) - 1]
            history[session] = list(prompt)
        turn = [next(next_id) for _ in range(int(rng.integers(1, 5)))]
        ids = history[session] + turn
        history[session] = [*ids, next(next_id)]  # the answer joins the history
        clock += int(rng.integers(50, 500))
        length = len(ids) * block_tokens - int(rng.integers(0, block_tokens))
        out.append(Request(clock, length, int(rng.integers(50, 600)), ids))
    return out


def conversation(requests: int, *, seed: int = 0, follow_up: float = 0.16) -> list[Request]:
    """A put-heavy, low-reuse trace (see the module docstring)."""
    rng = np.random.default_rng(seed)
    next_id = iter(range(1, 1 << 40))
    sessions: list[list[int]] = []
    out = []
    clock = 0
    for _ in range(requests):
        if sessions and rng.random() < follow_up:
            back = int(min(rng.zipf(1.3), len(sessions)))  # recent conversations return more
            ids = sessions[-back] + [next(next_id) for _ in range(int(rng.integers(1, 6)))]
            answer = [next(next_id) for _ in range(int(rng.integers(0, 2)))]
            sessions[-back] = ids + answer
        else:
            length = int(np.clip(rng.lognormal(2.6, 1.0), 1, 400))
            ids = [0] + [next(next_id) for _ in range(length)]  # block 0: the shared preamble
            sessions.append(list(ids))
        clock += int(rng.integers(0, 3000))
        length_tokens = len(ids) * MOONCAKE_BLOCK_TOKENS - int(
            rng.integers(0, MOONCAKE_BLOCK_TOKENS)
        )
        out.append(Request(clock, length_tokens, int(rng.integers(1, 900)), ids))
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
