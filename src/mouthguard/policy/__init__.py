"""Pure policy: importance levels and the decisions derived from them (no I/O here).

Every function takes plain data (:mod:`mouthguard.policy.facts`) and, where time
matters, ``now=`` as unix seconds; none reads a clock, a file or the network,
and every decision carries human-readable reasons.
"""

from mouthguard.policy.config import LevelPolicy, PolicyConfig, default_levels
from mouthguard.policy.deletion import CopyAction, decide_deletions
from mouthguard.policy.facts import CheckpointFacts, CopyFacts, TierFacts
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.policy.placement import Placement, Protection, plan_placement, protection_status
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
    "plan_placement",
    "protection_status",
]
