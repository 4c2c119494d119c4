"""Child process of the audit crash tests: an act frozen between its intent and its outcome.

``python -m tests.checkpoint.audit_child STORE ACT``: ``hold`` places a hold on
step 1 of run ``r`` and freezes at the first write of the hold sidecar;
``commit`` saves step 2 and freezes at the manifest's write. Either way it
prints ``paused`` and waits for the parent's SIGKILL.
"""

from __future__ import annotations

import sys
import threading

import torch
from typing_extensions import override

import mouthguard
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier
from mouthguard.tiers.wrapper import WrappedTier

RUN = "r"


class Freezing(WrappedTier):
    """Freezes the first put of a key containing ``marker`` (after saying so)."""

    def __init__(self, inner: Tier, marker: str) -> None:
        super().__init__(inner)
        self.marker = marker

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        if self.marker in key:
            print("paused", flush=True)
            threading.Event().wait()  # until the parent's SIGKILL
        return self.inner.put(key, data, mode=mode)


def main(store_path: str, act: str) -> None:
    """Run ``act`` on the store at ``store_path`` until it freezes."""
    marker = "sidecar.hold." if act == "hold" else "manifest.json"
    opened = mouthguard.open_store(store_path)
    store = mouthguard.Store([Freezing(t, marker) for t in opened.tiers], source=store_path)
    ckpt = mouthguard.Checkpointer(store, RUN, background=False, actor="child@test")
    if act == "hold":
        ckpt.hold(1, "legal", reason="frozen mid-act")
    else:
        ckpt.save(2, {"w": torch.ones(4)})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
