"""Setting aside a damaged committed copy: confirmed first, invisible at once, bytes kept.

Every caller that wants a damaged copy out of the way goes through
:func:`set_aside_confirmed`: a save that lands on a damaged step
(:func:`mouthguard.checkpoint.commit.clear_the_way`), a copy whose destination
already holds a damaged copy or whose read-back failed (:mod:`mouthguard.jobs.copy`),
and the replicator replacing a damaged copy from an intact one. A copy is set
aside only when a second, independent read confirms proven damage
(:func:`mouthguard.checkpoint.verification.confirm_damage`); a timeout, an I/O
error or a dead store never moves or removes anything.

Callers may race for the same copy; whoever comes second finds it already gone,
which is success, not an error.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.audit import audited
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.checkpoint.verification import confirm_damage
from mouthguard.errors import ObjectNotFoundError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)

_COPY_CHUNK_BYTES = 8 * 1024 * 1024


class SetAside(enum.Enum):
    """What :func:`set_aside_confirmed` did."""

    SET_ASIDE = "set aside"
    ALREADY_GONE = "already gone"  # another process set it aside or removed it first
    NOT_CONFIRMED = "not confirmed"  # a second read found no proven damage: left in place


def set_aside_confirmed(ref: CopyRef, reason: str, *, keys: Keyring | None = None) -> SetAside:
    """Set the committed copy ``ref`` aside if a second read confirms it is damaged.

    Raises:
        TierError: the tier failed while the copy was being moved; the copy is
            then still committed (never half set aside: the manifest goes first
            only once the bytes are safe elsewhere).
    """
    try:
        if not ref.tier.exists(ref.key(MANIFEST_NAME)):
            return SetAside.ALREADY_GONE
    except ObjectNotFoundError:
        return SetAside.ALREADY_GONE
    if not confirm_damage(ref, keys=keys):
        log.warning("not setting aside %s: a second read found no proven damage (%s)", ref, reason)
        return SetAside.NOT_CONFIRMED
    with audited("set-aside", ref.run, ref.step, [ref.tier], reason, keys=keys) as outcome:
        moved = _set_aside(ref, reason)
        if not moved:
            outcome.result, outcome.detail = "not needed", "already gone"
    return SetAside.SET_ASIDE if moved else SetAside.ALREADY_GONE


def _set_aside(ref: CopyRef, reason: str) -> bool:
    """Make the committed copy ``ref`` invisible; return False if it was already gone.

    Tiers that can rename move the whole directory to ``<step>.rejected-<id>``.
    Object stores cannot rename: every object is first copied under that prefix,
    then the copy is uncommitted by deleting its manifest, then the rest. Either
    way the bytes stay for inspection and are never deleted automatically.
    """
    prefix = ref.prefix
    aside = catalog.rejected_prefix(ref.run, ref.step, catalog.new_transaction_id())
    if ref.tier.capabilities.atomic_rename:
        try:
            ref.tier.rename_prefix(prefix.rstrip("/"), aside.rstrip("/"))
        except ObjectNotFoundError:
            return False  # another process set it aside first
        log.warning("set aside damaged copy %s as %s: %s", ref, aside, reason)
        return True
    try:
        keys = list(ref.tier.list(prefix))
        for key in keys:
            _copy_object(ref.tier, key, aside + key[len(prefix) :])
    except ObjectNotFoundError:
        if not ref.tier.exists(ref.key(MANIFEST_NAME)):
            return False  # another process removed it first
        raise
    existed = ref.tier.delete(prefix + MANIFEST_NAME)
    ref.tier.delete_prefix(prefix)
    if existed:
        log.warning("set aside damaged copy %s under %s: %s", ref, aside, reason)
    return existed


def _copy_object(tier: Tier, src: str, dst: str) -> None:
    size = tier.head(src).size

    def chunks() -> Iterator[bytes]:
        offset = 0
        while offset < size:
            end = min(offset + _COPY_CHUNK_BYTES, size)
            yield tier.get(src, offset, end)
            offset = end

    tier.put(dst, chunks(), mode=PutMode.OVERWRITE)
