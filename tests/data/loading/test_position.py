"""Position: the per-sample step keeps everything but the count."""

from __future__ import annotations

from dataclasses import fields, replace

from mouthguard.data.loading.position import Position


def test_at_changes_only_the_count() -> None:
    start = Position(
        "sha256:ab",
        epoch=3,
        consumed=10,
        seed=7,
        shuffle=True,
        shuffle_window=4,
        shuffle_buffer=64,
        rank=1,
        world_size=2,
    )
    moved = start.at(11)
    assert moved == replace(start, consumed=11)
    assert [
        f.name for f in fields(Position) if getattr(moved, f.name) != getattr(start, f.name)
    ] == ["consumed"]
