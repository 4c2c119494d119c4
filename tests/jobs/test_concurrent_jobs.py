"""Two workers running replication and gc on one store at once do not corrupt each other.

Each worker has its own Replicator (nothing shared but the files), like two agents
on two nodes. Commits are atomic (rename / create-only), sidecar writes are
whole-object replacements, setting aside tolerates the other worker having done
it first, and a trashed checkpoint is never re-replicated.
"""

from __future__ import annotations

import threading
import time

import torch

import mouthguard
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from tests.checkpoint.helpers import assert_same


def _state(step: int) -> dict[str, object]:
    return {"w": torch.arange(4096, dtype=torch.float32) + step, "step": step}


def test_two_workers_replicating_and_collecting_at_once(three_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(three_tier, run="r", background=False)
    for step in range(1, 9):
        ckpt.save(step, _state(step), importance="milestone" if step % 4 == 0 else "routine")
    start = time.time()
    errors: list[BaseException] = []

    def worker(offset: float) -> None:
        replicator = Replicator(three_tier)
        try:
            for i in range(4):
                replicator.run_once()
                # Far enough in the future that trashed copies are also purged.
                apply_retention(three_tier, now=start + offset + i * 2 * 86400)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(d,)) for d in (0.0, 3600.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)

    listed = [i.step for i in ckpt.list()]
    # Nothing half-visible, nothing the policy keeps is gone:
    assert listed == [4, 5, 6, 7, 8]  # routine 5, 6, 7 are the last 3; milestones 4, 8 kept
    for step in listed:
        assert_same(ckpt.load(step).state, _state(step))
    Replicator(three_tier).run_once()
    assert all(ckpt.info(s).state == "protected" for s in listed)  # type: ignore[union-attr]
    for tier in three_tier.tiers:
        assert not [k for k in tier.list("r/") if ".partial-" in k]
