"""Policy scenarios as plain JSON data: build facts, run the whole policy, render the outcome.

Used by the golden-file tests (``golden_test.py``) and by unit tests that want
the same compact builders. A scenario is::

    {
      "description": "...",
      "now": 1000000,
      "config": {...},          # a [policy] table (optional)
      "tiers": [{"name", "domain", "durable", "persistent", "object_lock", "is_fast"}],
      "checkpoints": [{"run", "step", "importance", "created", "valid", "held",
                       "metrics", "copies": [{"tier", "verified", "verified_at",
                                              "trashed_at"}]}],
      "expected": {...}         # what render() returns; rewritten on update
    }

Omitted fields take the dataclass defaults; a copy's domain is its tier's.
"""

from __future__ import annotations

from typing import Any

from mouthguard.policy import (
    CheckpointFacts,
    CopyFacts,
    Importance,
    PolicyConfig,
    TierFacts,
    decide_deletions,
    decide_retention,
    parse_importance,
    placement_for,
    protection_status,
)

Json = dict[str, Any]


def tier(
    name: str,
    domain: str,
    *,
    durable: bool = True,
    persistent: bool = True,
    object_lock: bool = False,
    is_fast: bool = False,
) -> TierFacts:
    """A tier, durable and persistent unless told otherwise."""
    return TierFacts(name, domain, durable, persistent, object_lock, is_fast)


def copy(
    tier_name: str,
    domain: str,
    *,
    verified: bool = False,
    trashed_at: float | None = None,
) -> CopyFacts:
    """A copy; ``verified_at`` is set to 0.0 when verified (no rule reads it)."""
    return CopyFacts(tier_name, domain, verified, 0.0 if verified else None, trashed_at)


def tiers_from(data: list[Json]) -> list[TierFacts]:
    """Tiers from their JSON form."""
    return [TierFacts(**t) for t in data]


def checkpoints_from(data: list[Json], tiers: list[TierFacts]) -> list[CheckpointFacts]:
    """Checkpoints from their JSON form; copies take their tier's domain by default."""
    domains = {t.name: t.domain for t in tiers}
    result = []
    for raw in data:
        fields = dict(raw)
        fields["importance"] = parse_importance(fields["importance"])
        fields["copies"] = tuple(
            CopyFacts(
                tier=c["tier"],
                domain=c.get("domain", domains.get(c["tier"], c["tier"])),
                verified=c.get("verified", False),
                verified_at=c.get("verified_at"),
                trashed_at=c.get("trashed_at"),
            )
            for c in raw.get("copies", [])
        )
        result.append(CheckpointFacts(**fields))
    return result


def render(scenario: Json) -> Json:
    """Run placement, protection, retention and deletion; return the JSON-able outcome."""
    config = PolicyConfig.from_toml(scenario.get("config", {}))
    tiers = tiers_from(scenario["tiers"])
    checkpoints = checkpoints_from(scenario["checkpoints"], tiers)
    now = scenario["now"]
    levels = [level for level in Importance if any(c.importance is level for c in checkpoints)]
    placements = {level: placement_for(level, tiers, config) for level in levels}
    by_key = {c.key: c for c in checkpoints}
    outcome = []
    for decision in decide_retention(checkpoints, config, now=now):
        ckpt = by_key[decision.key]
        placement = placements[ckpt.importance]
        protection = protection_status(ckpt, placement)
        actions = decide_deletions(ckpt, decision, placement, config, now=now)
        outcome.append(
            {
                "checkpoint": ckpt.label,
                "importance": ckpt.importance.value,
                "keep": decision.keep,
                "reasons": list(decision.reasons),
                "newest_valid": decision.newest_valid,
                "pinned_on_fast": list(decision.pin_reasons),
                "protection": {
                    "state": protection.state,
                    "met": list(protection.met),
                    "missing": list(protection.missing),
                },
                "actions": [
                    {"tier": a.tier, "action": a.action, "reason": a.reason} for a in actions
                ],
            }
        )
    return {
        "placement": {
            level.value: {
                "targets": list(p.targets),
                "required_copies": p.required_copies,
                "required_domains": p.required_domains,
                "verify": p.verify,
                "legal_hold": p.legal_hold,
                "satisfiable": p.satisfiable,
                "reasons": list(p.reasons),
            }
            for level, p in placements.items()
        },
        "checkpoints": outcome,
    }
