"""What every fuzz target shares: the generated :class:`Case`, the checks' :class:`Context`,
and the generic mutations (JSON, bytes, re-sealed, random) the targets build on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mouthguard.tiers.local import LocalTier
from reliability import fuzz_mutate as mut
from reliability.fuzz_seeds import Seeds

#: What a check's answer starts with when a damaged input was accepted.
ACCEPTED_CORRUPT = "accepted_corrupt: "


@dataclass
class Case:
    """One generated input: which target, how it was made, and its bytes."""

    target: str
    index: int
    mode: str
    parts: dict[str, bytes]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What the checks share: the seeds and a scratch directory."""

    seeds: Seeds
    scratch: Path
    key_tier: LocalTier | None = None

    def tier_for_keys(self) -> LocalTier:
        if self.key_tier is None:
            self.key_tier = LocalTier(self.scratch / "keys", name="keys", durable=False)
        return self.key_tier


# --- shared generation helpers -----------------------------------------------------


def json_mutated(rng: random.Random, doc: Any, focus: tuple[str | int, ...] = ()) -> Any:
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        doc = mut.mutate_json(rng, doc, focus=focus)
        if not mut.strip_markers(doc):
            break  # markers are terminal: further structural edits would not see inside
    return doc


def resealed(rng: random.Random, raw: bytes) -> bytes:
    prefix, _ = mut.split_sealed(raw)
    return mut.seal_prefix(mut.mutate_bytes(rng, prefix))


def bytes_mutated(rng: random.Random, raw: bytes) -> bytes:
    for _ in range(rng.choice([1, 1, 2, 4])):
        raw = mut.mutate_bytes(rng, raw)
    return raw


def random_bytes(rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 7, 8, 9, 64, 500, 5000])
    data = bytes(rng.getrandbits(8) for _ in range(size))
    if rng.random() < 0.3:  # random, but with a valid trailer so the parser looks inside
        return mut.seal_prefix(data)
    return data
