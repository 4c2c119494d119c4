"""The plain facts the policy decides on: tiers, copies, checkpoints.

Everything here is immutable data with no behaviour beyond derived views. The
layers above gather these facts from manifests, sidecars (verification receipts,
holds, trash marks) and the store configuration, and hand them to the pure
functions in :mod:`mouthguard.policy.placement`, :mod:`~mouthguard.policy.retention`
and :mod:`~mouthguard.policy.deletion`.

Time is a float of seconds since the Unix epoch everywhere in the policy package
(``created``, ``verified_at``, ``trashed_at`` and every ``now=``): arithmetic on
delays stays exact and trivially comparable, and no time zone can sneak in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mouthguard.policy.importance import Importance


@dataclass(frozen=True)
class TierFacts:
    """What the policy needs to know about one configured tier.

    Attributes:
        name: the tier's unique name in the store configuration.
        domain: its failure domain (node, rack, region): two copies in one domain
            can be lost to one event, so they count as one domain.
        durable: objects survive a crash and a power loss once written; only
            copies on durable tiers count as replicas above ``transient``.
        persistent: objects outlive the process (false for a RAM tier).
            Informational: the rules count durability, which implies it.
        object_lock: the tier can place a legal hold on objects.
        is_fast: the tier saves land on first (local NVMe, RAM). When no tier
            is marked fast, the first tier listed is the fast tier.
    """

    name: str
    domain: str
    durable: bool
    persistent: bool
    object_lock: bool = False
    is_fast: bool = False


@dataclass(frozen=True)
class CopyFacts:
    """One tier's committed copy of a checkpoint.

    Attributes:
        tier: the name of the tier holding the copy.
        domain: that tier's failure domain.
        verified: the copy was read back and matched its checksums.
        verified_at: when (unix seconds), if ever.
        trashed_at: when the copy was moved to the trash (unix seconds), or
            ``None`` if it is live. A trashed copy does not count as a copy.
        damage_reported: a reader found the copy damaged (a damage report, not
            yet confirmed or cleared): it is not verified whatever its receipt
            says, and it counts toward no protection until it reads back intact.
    """

    tier: str
    domain: str
    verified: bool = False
    verified_at: float | None = None
    trashed_at: float | None = None
    damage_reported: bool = False

    @property
    def trashed(self) -> bool:
        """The copy carries a trash mark."""
        return self.trashed_at is not None


@dataclass(frozen=True)
class CheckpointFacts:
    """What is known about one checkpoint across the store.

    Attributes:
        run: run name.
        step: training step (unique within the run).
        importance: the checkpoint's current importance.
        created: commit time (unix seconds).
        valid: ``True`` when the checkpoint was checked and can be loaded,
            ``False`` when it was checked and cannot (every copy corrupt, or its
            state failed a semantic check: suspect), ``None`` when it was never
            checked.
        held: a hold (legal hold, operator hold) is set: nothing of it is
            deleted anywhere while it lasts.
        checked: a semantic check of its state (``load(check=...)``) passed
            and none failed (a failed one makes it ``valid=False``).
        metrics: reported values such as ``{"loss": 1.23}`` (read-only copy).
        copies: one entry per tier holding a committed copy; tiers are unique.
        suspect: why its state failed a semantic check ("" when none did). A
            suspect checkpoint is known invalid whatever ``valid`` says: its bytes
            may verify, but a resume skips it; every decision names it
            ``suspect`` with this reason.
        released: its trainer gave it up (every copy is in the trash under the
            trainer's mark: Lightning's top-k dropped it). Retention keeps it
            only by a hold, critical importance or as a recovery point, never
            by keep-last, best-k or keep-within, so the store holds what the
            trainer holds.

    Raises:
        ValueError: ``step`` is negative or two copies name the same tier.
    """

    run: str
    step: int
    importance: Importance
    created: float
    valid: bool | None = None
    held: bool = False
    metrics: Mapping[str, float] = field(default_factory=dict)
    copies: tuple[CopyFacts, ...] = ()
    checked: bool = False
    suspect: str = ""
    released: bool = False

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"{self.run}/{self.step}: step must be >= 0")
        tiers = [c.tier for c in self.copies]
        if len(set(tiers)) != len(tiers):
            raise ValueError(f"{self.run}/{self.step}: two copies on one tier: {tiers}")
        # Freeze the metrics so a decision can never be changed by a later mutation
        # of the caller's dict.
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))

    @property
    def key(self) -> tuple[str, int]:
        """``(run, step)``: the checkpoint's identity and the policy's sort key."""
        return (self.run, self.step)

    @property
    def known_invalid(self) -> bool:
        """The checkpoint was checked and cannot be loaded, or its state is suspect."""
        return self.valid is False or bool(self.suspect)

    @property
    def invalid_because(self) -> str:
        """Why it is known invalid, in the one wording every report uses ("" if it is not).

        ``suspect: <reason>`` for a state that failed a check (its bytes may well
        verify), ``invalid: failed verification`` otherwise.
        """
        if self.suspect:
            return f"suspect: {self.suspect}"
        return "invalid: failed verification" if self.valid is False else ""

    @property
    def proven_valid(self) -> bool:
        """The checkpoint is known to load: marked valid, or a copy verified.

        A verified copy is proof on its own (its bytes matched the manifest), so
        an unchecked checkpoint with a verified copy counts as valid; an explicit
        ``valid=False`` (e.g. reference values disagree) always wins.
        """
        if self.suspect:
            return False
        if self.valid is not None:
            return self.valid
        return any(c.verified and not c.trashed for c in self.copies)

    @property
    def label(self) -> str:
        """``run/step`` for messages."""
        return f"{self.run}/{self.step}"


def check_time(name: str, value: float) -> float:
    """Return ``value`` as a float after checking it is a finite time.

    Raises:
        ValueError: ``value`` is NaN or infinite.
    """
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite unix time, got {value!r}")
    return value


def format_duration(seconds: float) -> str:
    """Render a duration for a reason string: ``"1d 2h"``, ``"45m 10s"``, ``"0s"``.

    Whole seconds only (a reason is for humans; the decision itself used the
    exact value). Negative durations render as ``"0s"``.
    """
    total = max(0, int(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) if parts else "0s"


def plural(count: int, word: str) -> str:
    """``"1 replica"``, ``"2 replicas"``: counts in reasons read as sentences."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def format_number(value: float) -> str:
    """Render a metric or count compactly and deterministically (``repr`` rounding)."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
