"""A loader's saved position: what it holds, and how a saved one is checked before use.

The state is plain JSON-able values, so it travels in a checkpoint as typed
JSON (``TrainingState(..., data=loader)``)::

    {"format": "mouthguard-data-position", "version": 2,
     "fingerprint": "sha256:...",      # the dataset the position is in
     "epoch": 3, "consumed": 12800,    # samples this rank delivered in that epoch
     "seed": 0, "shuffle": true, "shuffle_window": 4, "shuffle_buffer": 4096,
     "rank": 0, "world_size": 8}

Version 1 (before the shuffle buffer, :mod:`~mouthguard.data.loading.order`) has no
``shuffle_buffer``: it was taken under the uniform block permutation, so it is
read as ``shuffle_buffer=0``, the setting that reproduces that order -- a loader
built with ``shuffle_buffer=0`` resumes it exactly; any other refuses it (below).

Restoring checks, in this order: the shape and types (a malformed state is a
:class:`~mouthguard.errors.DataStateError`); the fingerprint -- another dataset
version is a :class:`~mouthguard.errors.DatasetChangedError` naming both
fingerprints, unless forced, when the position is kept (clamped to the new
epoch's length) although it no longer names the same samples; then the
configuration the order depends on (shuffle, window, rank and world size must
match: a position means nothing under another order or partition; so must the
shuffle buffer when shuffling). The seed is
part of the state and is restored. The batch size is not: the sample sequence
of a rank does not depend on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from mouthguard.errors import DatasetChangedError, DataStateError

log = logging.getLogger(__name__)

POSITION_FORMAT = "mouthguard-data-position"
POSITION_VERSION = 2
#: Versions read: 1 lacks ``shuffle_buffer`` (its order is ``shuffle_buffer=0``'s).
_READ_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Position:
    """Where a rank is in a dataset's sequence of epochs."""

    fingerprint: str
    epoch: int
    consumed: int
    seed: int
    shuffle: bool
    shuffle_window: int
    shuffle_buffer: int
    rank: int
    world_size: int

    def at(self, consumed: int) -> Position:
        """This position with ``consumed`` samples (a per-sample step: no ``replace``)."""
        return Position(
            self.fingerprint,
            self.epoch,
            consumed,
            self.seed,
            self.shuffle,
            self.shuffle_window,
            self.shuffle_buffer,
            self.rank,
            self.world_size,
        )

    def to_state(self) -> dict[str, object]:
        """The JSON-able state (see the module docstring)."""
        return {"format": POSITION_FORMAT, "version": POSITION_VERSION, **asdict(self)}


_INTS = ("epoch", "consumed", "seed", "shuffle_window", "shuffle_buffer", "rank", "world_size")


def parse_position(state: object) -> Position:
    """A :class:`Position` from a saved state, with every type checked.

    Raises:
        DataStateError: not a loader position of this version, or a value is wrong.
    """
    if not isinstance(state, Mapping):
        raise DataStateError(f"a data-loader state must be a mapping, not {type(state).__name__}")
    if state.get("format") != POSITION_FORMAT or state.get("version") not in _READ_VERSIONS:
        raise DataStateError(f"not a {POSITION_FORMAT} state of version {_READ_VERSIONS}")
    fields = set(Position.__dataclass_fields__)
    if state["version"] == 1:
        fields.discard("shuffle_buffer")  # version 1 has none
    expected = fields | {"format", "version"}
    if set(state) != expected:
        raise DataStateError(f"data-loader state must have exactly the keys {sorted(expected)}")
    if state["version"] == 1:
        state = {**state, "shuffle_buffer": 0}  # the order version 1 positions were taken in
        fields.add("shuffle_buffer")
    for name in _INTS:
        value = state[name]
        if type(value) is not int or value < 0:
            raise DataStateError(f"data-loader state: {name} must be an integer >= 0")
    if type(state["shuffle"]) is not bool or type(state["fingerprint"]) is not str:
        raise DataStateError("data-loader state: shuffle must be a bool, fingerprint a string")
    position = Position(**{name: state[name] for name in fields})
    if position.world_size < 1 or position.rank >= position.world_size:
        raise DataStateError(f"data-loader state: rank {position.rank} of {position.world_size}")
    return position


def restore(saved: Position, current: Position, rank_length: int, *, force: bool) -> Position:
    """The position to resume from: ``saved``, checked against the ``current`` configuration.

    Args:
        saved: the parsed saved position.
        current: the loader's own position (its dataset and configuration).
        rank_length: samples this rank reads in an epoch of the current dataset.
        force: resume even if the dataset changed (see the module docstring).

    Raises:
        DatasetChangedError: the fingerprints differ and ``force`` is false.
        DataStateError: the order or partition the position refers to differs.
    """
    if saved.fingerprint != current.fingerprint:
        if not force:
            raise DatasetChangedError.refusing(
                saved.fingerprint,
                current.fingerprint,
                resume_with="the loader's load_state_dict(..., force=True)",
            )
        log.warning(
            "resuming a data position of dataset %s on dataset %s (forced)",
            saved.fingerprint,
            current.fingerprint,
        )
    for name in ("shuffle", "shuffle_window", "shuffle_buffer", "rank", "world_size"):
        was, now = getattr(saved, name), getattr(current, name)
        if was != now:
            raise DataStateError(
                f"the saved data position was taken with {name}={was!r}, this loader has "
                f"{name}={now!r}: the position would name other samples"
            )
    consumed = saved.consumed
    if consumed > rank_length:
        if not force:
            raise DataStateError(
                f"the saved data position ({consumed} samples into epoch {saved.epoch}) is past "
                f"the end of this rank's epoch ({rank_length} samples)"
            )
        consumed = rank_length
    return replace(current, epoch=saved.epoch, consumed=consumed, seed=saved.seed)
