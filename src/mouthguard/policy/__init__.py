"""Pure policy: importance levels and the decisions derived from them (no I/O here).

Every function takes plain data (:mod:`mouthguard.policy.facts`) and, where time
matters, ``now=`` as unix seconds; none reads a clock, a file or the network,
and every decision carries human-readable reasons.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from mouthguard.policy.config import LevelPolicy, PolicyConfig, default_levels
from mouthguard.policy.deletion import CopyAction, decide_deletions
from mouthguard.policy.facts import CheckpointFacts, CopyFacts, TierFacts
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.policy.placement import Placement, Protection, placement_for, protection_status
from mouthguard.policy.retention import RetentionDecision, decide_retention

__all__ = [
    "CheckpointFacts",
    "CopyAction",
    "CopyFacts",
    "Importance",
    "LevelPolicy",
    "Placement",
    "PolicyConfig",
    "Protection",
    "RetentionDecision",
    "TierFacts",
    "decide_deletions",
    "decide_retention",
    "default_levels",
    "parse_importance",
    "placement_for",
    "protection_status",
]

#: Old public names -> their new names; still importable, with a DeprecationWarning.
_DEPRECATED = {"plan_placement": "placement_for"}


if not TYPE_CHECKING:  # type checkers see only the new names, and flag the old ones

    def __getattr__(name: str) -> Any:
        """Resolve a deprecated name to its replacement, warning the caller."""
        new = _DEPRECATED.get(name)
        if new is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"mouthguard.policy.{name} is deprecated; use mouthguard.policy.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
