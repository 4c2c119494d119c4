"""Lineage: what a checkpoint came from, recorded in its manifest.

The manifest member ``lineage`` (present only when there is something to say,
so manifests without it keep their exact bytes)::

    "lineage": {
      "parent":       {"run": "pretrain", "step": 2000},   # the checkpoint this state
                                                            # continued from: the last one
                                                            # its Checkpointer saved or loaded
      "resumed_from": {"run": "pretrain", "step": 2000,     # the checkpoint the process
                       "created": "2026-...+00:00"},        # resumed from (its load)
      "dataset":      {"key": "data", "fingerprint": "...", # the loader position saved in
                       "epoch": 1, "consumed": 4096}         # the state, with its dataset
    }

``parent`` links make a chain: ``mouthguard show RUN STEP`` follows them back to
the first checkpoint (one without a parent), across runs where a run was started
from another's checkpoint. ``created`` of ``resumed_from`` tells a re-saved step
(after a damaged copy was set aside) from the one actually loaded. The manifest
is signed with the rest, so with a manifest key the lineage is tamper-evident.
"""

from __future__ import annotations

from dataclasses import dataclass

from mouthguard.errors import FormatError
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.object_keys import is_valid_segment

_MAX_STEP = 10**12 - 1
_MAX_TEXT = 256


class LineageError(FormatError):
    """The ``lineage`` member of a manifest is malformed."""


@dataclass(frozen=True)
class Origin:
    """A checkpoint another one came from: run, step, and (when known) its commit time."""

    run: str
    step: int
    created: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON form (``created`` only when known)."""
        out: dict[str, JsonValue] = {"run": self.run, "step": self.step}
        if self.created is not None:
            out["created"] = self.created
        return out

    @classmethod
    def from_json(cls, raw: JsonValue, what: str) -> Origin:
        """Parse and check one origin (``what`` names it in errors)."""
        if not isinstance(raw, dict):
            raise LineageError(f"lineage.{what} must be an object")
        run, step, created = raw.get("run"), raw.get("step"), raw.get("created")
        if not isinstance(run, str) or not isinstance(step, int) or isinstance(step, bool):
            raise LineageError(f"lineage.{what} needs a string run and an integer step")
        if not 0 <= step <= _MAX_STEP:
            raise LineageError(f"lineage.{what}.step out of range: {step}")
        if created is not None and (not isinstance(created, str) or len(created) > _MAX_TEXT):
            raise LineageError(f"lineage.{what}.created must be a short string")
        if not is_valid_segment(run):
            raise LineageError(f"lineage.{what}.run is not a run name: {run!r}")
        return cls(run, step, created)


@dataclass(frozen=True)
class DatasetPosition:
    """The data loader's position saved in the state, and the dataset it belongs to."""

    key: str
    fingerprint: str
    epoch: int
    consumed: int

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON form."""
        return {
            "key": self.key,
            "fingerprint": self.fingerprint,
            "epoch": self.epoch,
            "consumed": self.consumed,
        }

    @classmethod
    def from_json(cls, raw: JsonValue) -> DatasetPosition:
        """Parse and check the dataset member."""
        if not isinstance(raw, dict):
            raise LineageError("lineage.dataset must be an object")
        key, fingerprint = raw.get("key"), raw.get("fingerprint")
        epoch, consumed = raw.get("epoch"), raw.get("consumed")
        if not (isinstance(key, str) and isinstance(fingerprint, str)):
            raise LineageError("lineage.dataset needs string key and fingerprint")
        if len(key) > _MAX_TEXT or len(fingerprint) > _MAX_TEXT:
            raise LineageError("lineage.dataset key and fingerprint must be short strings")
        for name, value in (("epoch", epoch), ("consumed", consumed)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise LineageError(f"lineage.dataset.{name} must be an integer >= 0")
        assert isinstance(epoch, int)
        assert isinstance(consumed, int)
        return cls(key, fingerprint, epoch, consumed)


@dataclass(frozen=True)
class Lineage:
    """What a checkpoint came from (see the module doc); every part is optional."""

    parent: Origin | None = None
    resumed_from: Origin | None = None
    dataset: DatasetPosition | None = None

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.parent, self.resumed_from, self.dataset))

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON form (only the parts that are known)."""
        out: dict[str, JsonValue] = {}
        if self.parent is not None:
            out["parent"] = self.parent.to_json()
        if self.resumed_from is not None:
            out["resumed_from"] = self.resumed_from.to_json()
        if self.dataset is not None:
            out["dataset"] = self.dataset.to_json()
        return out

    @classmethod
    def from_json(cls, raw: JsonValue) -> Lineage:
        """Parse and check the ``lineage`` member.

        Raises:
            LineageError: malformed (unknown members included: a typo is not ignored).
        """
        if not isinstance(raw, dict):
            raise LineageError("lineage must be an object")
        unknown = set(raw) - {"parent", "resumed_from", "dataset"}
        if unknown:
            raise LineageError(f"lineage has unknown members {sorted(unknown)}")
        parent, resumed, dataset = raw.get("parent"), raw.get("resumed_from"), raw.get("dataset")
        return cls(
            None if parent is None else Origin.from_json(parent, "parent"),
            None if resumed is None else Origin.from_json(resumed, "resumed_from"),
            None if dataset is None else DatasetPosition.from_json(dataset),
        )


__all__ = ["DatasetPosition", "Lineage", "LineageError", "Origin"]
