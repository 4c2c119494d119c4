"""Importance levels: parsing, aliases, order."""

from __future__ import annotations

import pytest

from mouthguard.policy.importance import Importance, parse_importance


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("transient", Importance.TRANSIENT),
        ("routine", Importance.ROUTINE),
        ("Milestone", Importance.MILESTONE),
        ("critical", Importance.CRITICAL),
        ("golden", Importance.CRITICAL),
        (" GOLDEN ", Importance.CRITICAL),
        (Importance.ROUTINE, Importance.ROUTINE),
    ],
)
def test_parse(text: str, level: Importance) -> None:
    assert parse_importance(text) is level


@pytest.mark.parametrize("bad", ["", "gold", "high", None, 3])
def test_unknown_levels_list_the_accepted_names(bad: object) -> None:
    with pytest.raises(ValueError, match="transient, routine, milestone, critical, golden"):
        parse_importance(bad)  # type: ignore[arg-type]


def test_order() -> None:
    ranks = [
        level.rank
        for level in (
            Importance.TRANSIENT,
            Importance.ROUTINE,
            Importance.MILESTONE,
            Importance.CRITICAL,
        )
    ]
    assert ranks == sorted(ranks) == [0, 1, 2, 3]
    assert str(Importance.CRITICAL) == "critical"
