"""Pure policy: importance levels and the decisions derived from them (no I/O here)."""

from mouthguard.policy.importance import Importance, parse_importance

__all__ = ["Importance", "parse_importance"]
