"""Checkpoint economics: sizing, interval optimisation and failure costs (pure arithmetic).

* :mod:`~mouthguard.plan.presets` — model presets and parameter-count parsing;
* :mod:`~mouthguard.plan.deployment` — the run a question is about: given
  figures, else the preset's, else the documented defaults;
* :mod:`~mouthguard.plan.sizing` — checkpoint bytes by component, shards, bursts,
  bandwidth, write volume and drive endurance;
* :mod:`~mouthguard.plan.intervals` — job MTBF, expected failures and lost work,
  Young's and Daly's optimal intervals, the exponential-failure waste model;
* :mod:`~mouthguard.plan.economics` — every figure ``mouthguard plan`` prints;
* :mod:`~mouthguard.plan.strategies` — the storage strategies compared
  (importance-aware, temperature tiering, flat, peer memory), as data;
* :mod:`~mouthguard.plan.peers` — peer memory: the chance a failure takes every
  copy of a rank, its saves, recoveries and optimal interval;
* :mod:`~mouthguard.plan.measured` — a run's recorded saves summarised
  (``--from-store``; the reading is the command line's);
* :mod:`~mouthguard.plan.simulate` — the seeded discrete-event simulator;
* :mod:`~mouthguard.plan.comparison` — the scenario ``mouthguard simulate``
  runs and the closed form beside it;
* :mod:`~mouthguard.plan.sweep` — expected cost against the interval;
* :mod:`~mouthguard.plan.plot` — the chart (the only module needing matplotlib).

Nothing here does I/O; the ``plan`` and ``simulate`` commands and the simulator
share these functions so their numbers agree, and the command-line modules
only parse options and render what these return. The storage core never
imports this package.
"""

from __future__ import annotations

from mouthguard.plan.intervals import (
    daly_interval,
    expected_failures,
    expected_lost_seconds_per_failure,
    expected_lost_seconds_per_failure_async,
    job_mtbf_seconds,
    waste_fraction,
    young_interval,
)
from mouthguard.plan.presets import PRESETS, ModelPreset, get_preset, resolve_model
from mouthguard.plan.sizing import DEFAULT_LAYOUT, StateLayout, checkpoint_bytes

__all__ = [
    "DEFAULT_LAYOUT",
    "PRESETS",
    "ModelPreset",
    "StateLayout",
    "checkpoint_bytes",
    "daly_interval",
    "expected_failures",
    "expected_lost_seconds_per_failure",
    "expected_lost_seconds_per_failure_async",
    "get_preset",
    "job_mtbf_seconds",
    "resolve_model",
    "waste_fraction",
    "young_interval",
]
