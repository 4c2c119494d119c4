"""Setting aside a damaged committed copy: invisible at once, bytes kept where possible.

Used by a save landing on a damaged step and by the replicator when it confirms
damage. Both may race for the same copy; whoever comes second finds it already
gone, which is success, not an error.
"""

from __future__ import annotations

import logging

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.errors import ObjectNotFoundError
from mouthguard.format.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)


def set_aside(ref: CopyRef, reason: str) -> bool:
    """Make the committed copy ``ref`` invisible; return False if it was already gone.

    Tiers that can rename move the whole directory to ``<step>.rejected-<id>``
    (kept for inspection, never deleted automatically). Object stores cannot
    rename: the copy is uncommitted by deleting its manifest first, then the rest
    (on a versioned bucket the old versions remain recoverable).
    """
    prefix = ref.prefix
    if ref.tier.capabilities.atomic_rename:
        txn = catalog.new_txn_id()
        aside = catalog.rejected_prefix(ref.run, ref.step, txn)
        try:
            ref.tier.rename_prefix(prefix.rstrip("/"), aside.rstrip("/"))
        except ObjectNotFoundError:
            return False  # another process set it aside first
        log.warning("set aside damaged copy %s as %s: %s", ref, aside, reason)
        return True
    existed = ref.tier.delete(prefix + MANIFEST_NAME)
    ref.tier.delete_prefix(prefix)
    if existed:
        log.warning("uncommitted damaged copy %s: %s", ref, reason)
    return existed
