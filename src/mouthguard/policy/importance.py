"""The importance hint carried down the write path.

Four levels, ordered from least to most valuable. ``golden`` is accepted as an
alias of ``critical`` on input and never produced on output, so manifests hold
exactly one spelling per level.
"""

from __future__ import annotations

import enum


class Importance(enum.StrEnum):
    """How much a checkpoint is worth; drives placement, protection and retention."""

    TRANSIENT = "transient"
    ROUTINE = "routine"
    MILESTONE = "milestone"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """Position in the order transient < routine < milestone < critical."""
        return _ORDER.index(self)


_ORDER = (Importance.TRANSIENT, Importance.ROUTINE, Importance.MILESTONE, Importance.CRITICAL)
_ALIASES = {"golden": Importance.CRITICAL}


def parse_importance(value: str | Importance) -> Importance:
    """Return the :class:`Importance` named by ``value`` (case-insensitive; ``golden`` = critical).

    Raises:
        ValueError: ``value`` names no level; the message lists the accepted names.
    """
    if isinstance(value, Importance):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in _ALIASES:
            return _ALIASES[name]
        try:
            return Importance(name)
        except ValueError:
            pass
    accepted = ", ".join([*(level.value for level in _ORDER), *_ALIASES])
    raise ValueError(f"unknown importance {value!r}; expected one of: {accepted}")
