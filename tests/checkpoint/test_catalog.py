"""The catalog under concurrent change: a pass over leftovers survives a commit mid-pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mouthguard


def test_collect_garbage_survives_a_save_committing_while_it_looks(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    ckpt = mouthguard.Checkpointer(store, run="r", background=False)
    tier, staging = store.fast, "r/000000000001.partial-0123456789abcdef/"
    tier.put(staging + "rank-00000.safetensors", [b"x" * 10])
    original_list = tier.list

    def list_then_commit(prefix: str = "") -> Iterator[str]:
        keys = list(original_list(prefix))
        if prefix == staging:  # the save commits right between the listing and the stat
            tier.rename_prefix(staging.rstrip("/"), "r/000000000001")
        return iter(keys)

    tier.list = list_then_commit  # type: ignore[method-assign]
    reports = ckpt.collect_garbage(grace_seconds=3600)
    assert [r.partial_saves for r in reports] == [[], []]
    assert tier.exists("r/000000000001/rank-00000.safetensors")
