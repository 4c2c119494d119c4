"""A testing kit for tiers: the conformance suite every tier passes, and fault injection.

Two parts, usable on their own:

* :mod:`mouthguard.testing.conformance` -- :class:`TierConformance`, the contract
  of :mod:`mouthguard.tiers.base` as a pytest suite. Whoever writes a tier for
  their own storage subclasses it, provides a ``make_tier`` fixture and runs
  pytest (see ``docs/testing.md``). It imports pytest, so it is a module of its
  own: ``from mouthguard.testing.conformance import TierConformance``.
* :class:`FaultyTier` and :class:`FaultPlan` (re-exported from
  :mod:`mouthguard.tiers.faults`, where the ``chaos`` command uses them too): a
  wrapper that makes any tier misbehave the way real storage does (I/O errors,
  ENOSPC, torn and short writes, flipped bits, failed fsyncs, delays), seeded and
  reproducible. No pytest needed.

Nothing in mouthguard's storage core imports this package; it imports only
:mod:`mouthguard.errors` and :mod:`mouthguard.tiers`.
"""

from mouthguard.tiers.faults import (
    COMPOSED,
    KINDS,
    OPS,
    ConfinementError,
    FaultEvent,
    FaultPlan,
    FaultyTier,
    InjectedDurabilityError,
    InjectedFaultError,
    InjectedNoSpaceError,
    unwrap,
)

__all__ = [
    "COMPOSED",
    "KINDS",
    "OPS",
    "ConfinementError",
    "FaultEvent",
    "FaultPlan",
    "FaultyTier",
    "InjectedDurabilityError",
    "InjectedFaultError",
    "InjectedNoSpaceError",
    "unwrap",
]
