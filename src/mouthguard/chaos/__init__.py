"""Chaos: save, load, replicate, retain and collect through faulty tiers; judge with clean ones.

A chaos run drives one scratch run of a store for many rounds. Every tier is
wrapped in a :class:`~mouthguard.tiers.faults.FaultyTier` (seeded, confined to
``<run>/`` so nothing else on the store can be touched). Each round, through
the faulty tiers:

1. ``save`` the next step, then ``save_async`` the one after (importance drawn
   at random; the state of a step is a pure function of the step);
2. ``load()`` the newest valid checkpoint, and ``load(step)`` one acknowledged step;
3. one replication pass, one retention pass (trash delay 0, so purges happen
   within a few rounds) and garbage collection of partial saves.

Then, through the *unwrapped* tiers, the invariants are checked:

``accepted_corrupt``   every checkpoint a load accepted (faulty or clean tiers)
                       holds exactly the state saved at its step;
``lost_acknowledged``  every acknowledged save (returned without error) still
                       loads from some tier, unless retention decided to delete
                       it, or the storage acknowledged a torn or short write of
                       it *while it was being saved* (then no copy was ever
                       intact: counted apart as ``lost_to_storage``);
``writes_outside``     no write outside ``<run>/`` was attempted;
``crashes``            no operation raised anything but a ``MouthguardError``;
``false_damage``       every copy set aside (``<step>.rejected-<id>/``) fails
                       verification through the unwrapped tier: an intact copy
                       is never moved, whatever the faulty tiers made a reader
                       see (a bit flip on read, an I/O error, a timeout) -- so
                       a round in which only transient faults hit a copy moves
                       none;
``false_receipt``      every copy with a receipt (``sidecar.verified.json``)
                       verifies through the unwrapped tier now.

A round *survives* when none of these happened in it; the injected faults of
surviving rounds are the ``survived`` count. One function,
:func:`run_chaos`, serves the ``mouthguard chaos`` command and
``reliability/chaos.py``.

A layer of its own, above the storage core (it drives checkpoint and jobs
through fault-injecting tiers) and below the CLI: an exercise that judges the
store, not a job the store runs, so nothing in the core imports it.
Modules: :mod:`~mouthguard.chaos.state` (the state a step saves, compared
exactly), :mod:`~mouthguard.chaos.report` (what a run counted),
:mod:`~mouthguard.chaos.run` (the rounds and the judge).
"""

from __future__ import annotations

from mouthguard.chaos.report import ChaosReport
from mouthguard.chaos.run import (
    DEFAULT_FAULTS,
    chaos_policy,
    remove_run,
    run_chaos,
    scratch_run_name,
)
from mouthguard.chaos.state import chaos_state, same_state

__all__ = [
    "DEFAULT_FAULTS",
    "ChaosReport",
    "chaos_policy",
    "chaos_state",
    "remove_run",
    "run_chaos",
    "same_state",
    "scratch_run_name",
]
