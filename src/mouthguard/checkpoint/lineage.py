"""Lineage on the checkpoint side: what a save came from, and the chain back.

A :class:`Tracker` lives in each ``Checkpointer``: a successful ``load`` makes
the loaded checkpoint both the *resumed-from* and the *parent* of the next
save; every save becomes the parent of the one after it. The dataset position is
found in the saved state itself: a mapping at the top level of the state (or the
state itself) with a string ``fingerprint`` and integer ``epoch`` and
``consumed`` -- what ``mouthguard.data``'s loaders' ``state_dict()`` returns
(``TrainingState(data=loader)`` saves it under ``"data"``). This layer cannot
import ``mouthguard.data``, so it recognises the shape rather than the type.
Multi-rank: the coordinator's position is the one recorded.

:func:`chain` walks ``parent`` links back through the manifests to the first
checkpoint (bounded: :data:`MAX_CHAIN` links, and a loop stops the walk).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError
from mouthguard.format.lineage import DatasetPosition, Lineage, Origin
from mouthguard.format.manifest import Manifest

#: The longest chain ``show`` walks (a run with a save every 10 minutes for 2 years).
MAX_CHAIN = 100_000


def dataset_position(state: object) -> DatasetPosition | None:
    """The loader position inside ``state`` (see the module doc), or None."""
    if not isinstance(state, Mapping):
        return None
    candidates = [("", state), *((str(k), v) for k, v in state.items())]
    for key, value in candidates:
        if not isinstance(value, Mapping):
            continue
        fingerprint, epoch, consumed = (value.get(k) for k in ("fingerprint", "epoch", "consumed"))
        if (
            isinstance(fingerprint, str)
            and isinstance(epoch, int)
            and isinstance(consumed, int)
            and not isinstance(epoch, bool)
            and not isinstance(consumed, bool)
            and epoch >= 0
            and consumed >= 0
            and len(fingerprint) <= 256
            and len(key) <= 256
        ):
            return DatasetPosition(key, fingerprint, epoch, consumed)
    return None


class Tracker:
    """The parent and resume point of the next save of one checkpointer (thread-safe)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._lock = threading.Lock()
        self.parent: Origin | None = None
        self.resumed_from: Origin | None = None

    def loaded(self, run: str, step: int, created: dt.datetime) -> None:
        """A load succeeded: the next save continues from that checkpoint."""
        origin = Origin(run, step, created.isoformat())
        with self._lock:
            self.parent = self.resumed_from = origin

    def lineage_of_save(self, step: int, state: object) -> Lineage | None:
        """The lineage of a save of ``step`` now; that save becomes the next one's parent."""
        with self._lock:
            lineage = Lineage(self.parent, self.resumed_from, dataset_position(state))
            self.parent = Origin(self.run, step)
        return lineage or None

    def failed(self, previous: Origin | None) -> None:
        """A save failed: its parent stays the next save's parent."""
        with self._lock:
            self.parent = previous


@dataclass(frozen=True)
class Link:
    """One checkpoint of a chain: where it is, and its lineage (None: unreadable or absent)."""

    origin: Origin
    lineage: Lineage | None
    missing: str = ""


def chain(store: Store, run: str, step: int) -> list[Link]:
    """The checkpoint ``run``/``step`` and its ancestors, newest first.

    Stops at a checkpoint without a parent, at one that cannot be read (its link
    says why), at a loop, or after :data:`MAX_CHAIN` links.
    """
    links: list[Link] = []
    seen: set[tuple[str, int]] = set()
    origin: Origin | None = Origin(run, step)
    while origin is not None and len(links) < MAX_CHAIN:
        if (origin.run, origin.step) in seen:
            links.append(Link(origin, None, "a loop: this checkpoint is already in the chain"))
            break
        seen.add((origin.run, origin.step))
        manifest, why = _manifest(store, origin)
        if manifest is None:
            links.append(Link(origin, None, why))
            break
        lineage = manifest.lineage or Lineage()
        created = manifest.created.isoformat()
        links.append(Link(Origin(origin.run, origin.step, created), lineage))
        origin = lineage.parent
    return links


def _manifest(store: Store, origin: Origin) -> tuple[Manifest | None, str]:
    """The manifest of ``origin`` from the first tier that has a readable one."""
    why = "not in the store (deleted, or never committed)"
    for tier in catalog.tiers_holding(store.tiers, origin.run, origin.step):
        try:
            return Manifest.from_bytes(tier.get(catalog.manifest_key(origin.run, origin.step))), ""
        except MouthguardError as exc:
            why = f"manifest unreadable on {tier.name}: {exc}"
    return None, why


__all__ = ["MAX_CHAIN", "Link", "Tracker", "chain", "dataset_position"]
