"""Passing a checkpoint's importance down to the storage: xattrs, object tags. Advisory only.

mouthguard's own policy is the guarantee; a hint lets the storage underneath
(an Object-Lock bucket's lifecycle rules, a filesystem's tiering) see it too.
So a hint that cannot be set is logged and never fails what asked for it.
"""

from __future__ import annotations

import logging

from mouthguard.checkpoint.reader import read_manifest
from mouthguard.checkpoint.sidecars import CopyRef
from mouthguard.errors import MouthguardError
from mouthguard.format.manifest import MANIFEST_NAME, Manifest
from mouthguard.policy.importance import Importance

log = logging.getLogger(__name__)


def pass_hint_down(ref: CopyRef, level: Importance, manifest: Manifest | None = None) -> None:
    """Annotate every file of the copy ``ref``, and its manifest, with ``level``.

    ``manifest`` saves re-reading it when the caller has it (a save or a copy
    just wrote it). Stops at the first failure: a tier that refuses one
    annotation refuses them all, and one log line says so.
    """
    try:
        if manifest is None:
            manifest = read_manifest(ref.tier, ref.run, ref.step)
        for name in [*(f.name for f in manifest.files), MANIFEST_NAME]:
            ref.tier.annotate(ref.key(name), {"importance": level.value})
    except MouthguardError as exc:
        log.info("could not pass the importance hint down for %s: %s", ref, exc)
