"""Sidecars: the mutable facts of a checkpoint copy, stored next to its manifest.

The manifest is immutable once committed. Everything that changes later is a
small JSON object in the same directory, one per fact, written atomically:

=============================  ==============================================
``sidecar.verified.json``      read-back verification receipt (names the manifest
                               checksum it vouches for)
``sidecar.importance.json``    importance changed after the save (promote/demote)
``sidecar.hold.<name>.json``   a named hold: blocks deletion of the checkpoint
``sidecar.trash.json``         this copy is in the trash since a given time
``sidecar.damage.json``        a reader found this copy damaged (to be confirmed
                               and repaired by the replicator)
``sidecar.legal-hold.json``    mouthguard put this copy under Object Lock legal hold
=============================  ==============================================

Every sidecar is sealed like the manifest (its last member is the checksum of
its own bytes, :mod:`mouthguard.format.sealed`).

The store stays self-describing: no separate database to lose. Facts are kept
per copy (per tier) so each copy carries them; readers merge them across tiers
(a hold on any tier holds the checkpoint everywhere; the newest importance
change wins).

Safety rule: a hold sidecar that cannot be parsed still counts as a hold. A
damaged fact may only ever make the system *more* careful.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.catalog import checkpoint_prefix, manifest_key
from mouthguard.errors import FormatError, MouthguardError, ObjectNotFoundError
from mouthguard.format import typed_json
from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.sealed import seal, unseal
from mouthguard.policy.importance import Importance, parse_importance
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.object_keys import validate_segment

log = logging.getLogger(__name__)

SIDECAR_PREFIX = "sidecar."
RECEIPT = "sidecar.verified.json"
IMPORTANCE = "sidecar.importance.json"
TRASH = "sidecar.trash.json"
DAMAGE = "sidecar.damage.json"
LEGAL_HOLD = "sidecar.legal-hold.json"
SUSPECT = "sidecar.suspect.json"
CHECKED = "sidecar.checked.json"
_HOLD_PREFIX = "sidecar.hold."
_MAX_SIDECAR_BYTES = 64 * 1024


@dataclass(frozen=True)
class Hold:
    """A named hold on a checkpoint (legal, investigation, release candidate...)."""

    name: str
    reason: str
    placed_at: dt.datetime | None


@dataclass(frozen=True)
class Sidecars:
    """Every mutable fact recorded next to one copy."""

    verified_at: dt.datetime | None = None
    importance: Importance | None = None
    importance_changed_at: dt.datetime | None = None
    importance_reason: str = ""
    holds: tuple[Hold, ...] = field(default_factory=tuple)
    trashed_at: dt.datetime | None = None
    trash_reason: str = ""
    damage: str = ""
    suspect: str = ""
    checked_at: dt.datetime | None = None
    #: The trash mark says the checkpoint's trainer gave it up (see ``mark_trashed``).
    trash_released: bool = False


def hold_name(name: str) -> str:
    """Validate a hold name (a safe path segment)."""
    try:
        return validate_segment(name)
    except MouthguardError:
        raise ValueError(
            f"invalid hold name {name!r}: use letters, digits, '_', '.', '-'"
        ) from None


@dataclass(frozen=True)
class CopyRef:
    """One copy of a checkpoint: the tier that holds it, and the run and step."""

    tier: Tier
    run: str
    step: int

    @property
    def prefix(self) -> str:
        """The copy's key prefix (``<run>/<step>/``)."""
        return checkpoint_prefix(self.run, self.step)

    def key(self, name: str) -> str:
        """Key of file ``name`` of this copy."""
        return self.prefix + name

    def __str__(self) -> str:
        return f"{self.run} step {self.step} on {self.tier.name}"


def _put(ref: CopyRef, name: str, body: Mapping[str, str]) -> None:
    # Sealed like the manifest: a sidecar carries its own checksum.
    ref.tier.put(ref.key(name), seal(dict(body)), mode=PutMode.OVERWRITE)


def _read(tier: Tier, key: str) -> dict[str, typed_json.JsonValue] | None:
    """Parse a sidecar; None if absent. Raises FormatError when damaged."""
    try:
        info = tier.head(key)
        if info.size > _MAX_SIDECAR_BYTES:
            raise FormatError(f"sidecar {key} is {info.size} bytes: too large")
        return unseal(tier.get(key), "sidecar")
    except ObjectNotFoundError:
        return None


def _time(value: object) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:  # mouthguard writes UTC offsets; a bare time is UTC
            parsed = parsed.replace(tzinfo=dt.UTC)
        # Facts travel as float timestamps: the time must survive the round trip.
        dt.datetime.fromtimestamp(parsed.timestamp(), dt.UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return parsed


# --- writing ------------------------------------------------------------------


def write_receipt(ref: CopyRef, manifest_bytes: bytes, when: dt.datetime) -> None:
    """Record that this copy was read back and verified at ``when``."""
    _put(ref, RECEIPT, {"manifest": xxh3_digest(manifest_bytes), "verified_at": when.isoformat()})


def write_importance(ref: CopyRef, importance: Importance, reason: str, when: dt.datetime) -> None:
    """Record an importance change on this copy."""
    body = {"importance": importance.value, "reason": reason, "changed_at": when.isoformat()}
    _put(ref, IMPORTANCE, body)


def place_hold(ref: CopyRef, name: str, reason: str, when: dt.datetime) -> None:
    """Place hold ``name`` on this copy."""
    body = {"name": hold_name(name), "reason": reason, "placed_at": when.isoformat()}
    _put(ref, f"{_HOLD_PREFIX}{name}.json", body)


def release_hold(ref: CopyRef, name: str) -> bool:
    """Remove hold ``name`` from this copy; return whether it was there."""
    return ref.tier.delete(ref.key(f"{_HOLD_PREFIX}{hold_name(name)}.json"))


def mark_trashed(ref: CopyRef, reason: str, when: dt.datetime, *, released: bool = False) -> None:
    """Put this copy in the trash (it is purged only after the policy's delay).

    ``released``: its trainer gave it up (Lightning's top-k dropped it), so
    retention's keep-last, best-k and keep-within rules no longer keep it --
    only a hold, critical importance or being the newest valid checkpoint does.
    """
    body = {"reason": reason, "trashed_at": when.isoformat()}
    if released:
        body["released"] = "true"
    _put(ref, TRASH, body)


def report_damage(ref: CopyRef, reason: str, when: dt.datetime) -> None:
    """Record that a reader found this copy damaged; its receipt no longer vouches.

    The finding is an act of the audit trail (``damage``), recorded first.
    """
    with audited("damage", ref.run, ref.step, [ref.tier], reason):
        _put(ref, DAMAGE, {"reason": reason, "found_at": when.isoformat()})
        ref.tier.delete(ref.key(RECEIPT))


def mark_suspect(ref: CopyRef, reason: str, when: dt.datetime) -> None:
    """Record that a semantic check of the loaded state failed (the bytes may be intact)."""
    _put(ref, SUSPECT, {"reason": reason, "found_at": when.isoformat()})
    ref.tier.delete(ref.key(CHECKED))


def mark_checked(ref: CopyRef, when: dt.datetime) -> None:
    """Record that a semantic check of the loaded state passed."""
    _put(ref, CHECKED, {"checked_at": when.isoformat()})


def clear_suspect(ref: CopyRef) -> bool:
    """Forget a suspect mark (an operator judged the state sound)."""
    return ref.tier.delete(ref.key(SUSPECT))


def clear_damage(ref: CopyRef) -> bool:
    """Forget a damage report (the copy was re-verified and is intact)."""
    return ref.tier.delete(ref.key(DAMAGE))


def mark_legal_hold(ref: CopyRef, when: dt.datetime) -> None:
    """Record that mouthguard put this copy's objects under Object Lock legal hold."""
    _put(ref, LEGAL_HOLD, {"placed_at": when.isoformat()})


def has_legal_hold_mark(ref: CopyRef) -> bool:
    """Whether mouthguard placed legal holds on this copy (and has not released them)."""
    return ref.tier.exists(ref.key(LEGAL_HOLD))


def clear_legal_hold_mark(ref: CopyRef) -> bool:
    """Forget the legal-hold mark (after the holds were released)."""
    return ref.tier.delete(ref.key(LEGAL_HOLD))


def check_sidecars(ref: CopyRef) -> list[tuple[str, str]]:
    """Every sidecar of the copy that fails its checksum or does not parse: (name, why).

    For ``verify``: the readers above tolerate damaged facts (conservatively), but
    an operator must hear about them.
    """
    damaged = []
    for key in ref.tier.list(ref.prefix + SIDECAR_PREFIX):
        try:
            _read(ref.tier, key)
        except FormatError as exc:
            damaged.append((key[len(ref.prefix) :], str(exc)))
    return damaged


def restore_from_trash(ref: CopyRef) -> bool:
    """Take this copy out of the trash; return whether it was trashed."""
    return ref.tier.delete(ref.key(TRASH))


# --- reading ------------------------------------------------------------------


def read_sidecars(ref: CopyRef) -> Sidecars:
    """Read every fact recorded next to one copy.

    Damaged facts are logged and ignored, except holds: an unreadable hold still
    holds (with its damage as the reason), so corruption never enables a deletion.
    """
    tier, prefix = ref.tier, ref.prefix
    names = [key[len(prefix) :] for key in tier.list(prefix + SIDECAR_PREFIX)]
    verified_at = _receipt(ref) if RECEIPT in names else None
    importance, changed_at, why = None, None, ""
    if IMPORTANCE in names:
        try:
            body = _read(tier, prefix + IMPORTANCE) or {}
            importance = parse_importance(str(body.get("importance")))
            changed_at, why = _time(body.get("changed_at")), str(body.get("reason", ""))
        except (FormatError, ValueError) as exc:
            log.warning("ignoring damaged importance sidecar of %s: %s", ref, exc)
    holds = tuple(_hold(tier, prefix, n) for n in names if n.startswith(_HOLD_PREFIX))
    trashed_at, trash_reason, released = None, "", False
    if TRASH in names:
        try:
            body = _read(tier, prefix + TRASH) or {}
            trashed_at, trash_reason = _time(body.get("trashed_at")), str(body.get("reason", ""))
            released = body.get("released") == "true"
        except FormatError as exc:
            log.warning("damaged trash mark of %s: %s", ref, exc)
        if trashed_at is None:
            # A trash mark without a readable time restarts the delay: never purge early.
            trashed_at, trash_reason = dt.datetime.now(dt.UTC), trash_reason or "damaged trash mark"
    damage = ""
    if DAMAGE in names:
        try:
            damage = str((_read(tier, prefix + DAMAGE) or {}).get("reason", "")) or "damaged"
        except FormatError as exc:
            damage = f"damage report unreadable ({exc})"
    if damage:
        verified_at = None  # a damage report outranks any receipt
    suspect = ""
    if SUSPECT in names:
        try:
            suspect = str((_read(tier, prefix + SUSPECT) or {}).get("reason", "")) or "suspect"
        except FormatError as exc:
            suspect = f"suspect mark unreadable ({exc})"  # still suspect: never trust it
    checked_at = None
    if CHECKED in names and not suspect:
        try:
            checked_at = _time((_read(tier, prefix + CHECKED) or {}).get("checked_at"))
        except FormatError as exc:
            log.warning("ignoring damaged check record of %s: %s", ref, exc)
    return Sidecars(
        verified_at=verified_at,
        importance=importance,
        importance_changed_at=changed_at,
        importance_reason=why,
        holds=holds,
        trashed_at=trashed_at,
        trash_reason=trash_reason,
        damage=damage,
        suspect=suspect,
        checked_at=checked_at,
        trash_released=released,
    )


def _hold(tier: Tier, prefix: str, name: str) -> Hold:
    hold = name[len(_HOLD_PREFIX) :].removesuffix(".json")
    try:
        body = _read(tier, prefix + name) or {}
    except FormatError as exc:
        return Hold(hold, f"unreadable hold sidecar, still holding ({exc})", None)
    return Hold(hold, str(body.get("reason", "")), _time(body.get("placed_at")))


def _receipt(ref: CopyRef) -> dt.datetime | None:
    try:
        body = _read(ref.tier, ref.key(RECEIPT))
        manifest = ref.tier.get(manifest_key(ref.run, ref.step))
    except (FormatError, ObjectNotFoundError):
        return None
    if body is None or body.get("manifest") != xxh3_digest(manifest):
        return None  # vouches for another manifest: worthless
    return _time(body.get("verified_at"))
