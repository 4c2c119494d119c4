"""Child process for the crash test: saves until it freezes at a chosen point of a save.

``python -m tests.checkpoint.crash_child STORE START SAVES POINT`` saves steps
``START, START+1, ...`` into the store at ``STORE`` (with background
replication, as training would), printing ``saving N`` before and ``acked N``
after each save. After ``SAVES`` acknowledged saves, the next save freezes at
``POINT`` of the commit protocol on the fast tier (one of :data:`POINTS`): the
child prints ``paused N POINT`` and blocks until the parent kills it. The kill
thus lands at a known point, however slow or busy the machine is.

Exits with status 2 if a save completes without reaching ``POINT`` (the commit
protocol changed): the parent reports that rather than waiting forever.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import torch

import mouthguard
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, iter_buffers
from mouthguard.tiers.wrapper import WrappedTier

ELEMENTS = 1024 * 1024  # 4 MiB of float32: the rank file goes through the write pipeline

RUN = "crash"

#: Where a save can be frozen, in protocol order. Every point but the last is
#: before the commit: a kill there must leave the step invisible.
POINTS = (
    "before-rank-file",  # the rank file's put was called, nothing handed over yet
    "rank-file-first-chunk",  # its first chunk was handed to the tier
    "rank-file-all-chunks",  # every chunk handed over; the put has not returned
    "rank-file-written",  # the rank file's put returned
    "before-manifest",
    "manifest-all-chunks",
    "manifest-written",  # the staged checkpoint is complete but not yet renamed
    "committed",  # the rename returned: committed, but the save was not acknowledged
)
COMMITTED = "committed"


def state_for(step: int) -> dict[str, object]:
    """The deterministic state saved at ``step`` (the parent recomputes it to compare)."""
    return {
        "w": torch.arange(ELEMENTS, dtype=torch.float32) + step,
        "b": torch.full((1000,), float(step), dtype=torch.bfloat16),
        "meta": {"step": step, "note": f"save {step}"},
    }


class FreezingTier(WrappedTier):
    """Forwards to ``inner``; once armed for a step, freezes that step's save at ``point``.

    Only the rank file and manifest puts of that step (wherever the save stages
    them) and its commit rename count: the background replication, which writes
    only receipts to this tier, never freezes.
    """

    def __init__(self, inner: Tier, point: str) -> None:
        super().__init__(inner)
        self.point = point
        self._step: int | None = None

    def arm(self, step: int) -> None:
        """Freeze the save of ``step`` when it reaches the point."""
        self._step = step

    def _reached(self, point: str, key: str) -> None:
        step = self._step
        if point != self.point or step is None or not key.startswith(f"{RUN}/{step:012d}"):
            return
        print(f"paused {step} {point}", flush=True)
        threading.Event().wait()  # until the parent's SIGKILL

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Forwarded, with the freezing points of a rank file or manifest."""
        if key.endswith(".safetensors"):
            kind = "rank-file"
        elif key.endswith(MANIFEST_NAME):
            kind = "manifest"
        else:
            return self.inner.put(key, data, mode=mode)
        self._reached(f"before-{kind}", key)
        info = self.inner.put(key, self._handed(kind, key, data), mode=mode)
        self._reached(f"{kind}-written", key)
        return info

    def _handed(self, kind: str, key: str, data: PutData) -> Iterator[memoryview]:
        for i, chunk in enumerate(iter_buffers(data)):
            yield chunk
            if i == 0:
                self._reached(f"{kind}-first-chunk", key)
        self._reached(f"{kind}-all-chunks", key)

    def rename_prefix(self, src: str, dst: str) -> None:
        """Forwarded; the commit point is right after it."""
        self.inner.rename_prefix(src, dst)
        self._reached(COMMITTED, src)


def main() -> None:
    """Save steps from ``START`` on; freeze the save after ``SAVES`` acknowledged ones."""
    path, start, saves, point = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if point not in POINTS:
        sys.exit(f"unknown point {point!r}; one of {POINTS}")
    store = mouthguard.open_store(path)
    fast = FreezingTier(store.fast, point)
    frozen = mouthguard.Store([fast, *store.tiers[1:]], source=store.source, policy=store.policy)
    ckpt = mouthguard.Checkpointer(frozen, run=RUN)
    for step in range(start, start + saves + 1):
        if step == start + saves:
            fast.arm(step)
        print(f"saving {step}", flush=True)
        ckpt.save(step, state_for(step))
        print(f"acked {step}", flush=True)
    print(f"error: the save of step {start + saves} never reached {point!r}", flush=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
