"""The in-process background service started by the Checkpointer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.jobs.service import service_for
from tests.checkpoint.helpers import flip_byte
from tests.fake_clock import FakeClock


def _dir(store: mouthguard.Store, tier: str, step: int) -> Path:
    return Path(store.tier(tier).location(f"r/{step:012d}/"))


def test_checkpointer_replicates_in_the_background(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r")
    assert ckpt.background
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((1000,), float(step))})
    assert ckpt.wait_replicated(timeout=60)
    for step in (1, 2, 3):
        info = ckpt.info(step)
        assert info is not None
        assert sorted(c.tier for c in info.copies) == ["durable", "fast"]
        assert all(c.verified for c in info.copies)
    status = service_for(two_tier).status()
    assert status.running and status.copied_bytes > 0 and status.queued == 0


def test_single_tier_store_has_no_background_thread(tmp_path: Path) -> None:
    from tests.jobs.conftest import make_store  # noqa: PLC0415

    store = make_store(tmp_path / "single", ("fast", "node-a"))
    ckpt = mouthguard.Checkpointer(store, run="r")
    assert not ckpt.background
    ckpt.save(1, {"w": torch.ones(2)})
    assert ckpt.wait_replicated(timeout=1)


def test_background_off_leaves_replication_to_the_agent(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(2)})
    assert not ckpt.wait_replicated(timeout=0.1)
    assert [c.tier for c in ckpt.info(1).copies] == ["fast"]  # type: ignore[union-attr]


def test_damage_found_by_load_is_repaired_in_the_background(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r")
    ckpt.save(1, {"w": torch.arange(4096.0)}, importance="milestone")
    assert ckpt.wait_replicated(timeout=60)
    flip_byte(_dir(two_tier, "fast", 1) / "rank-00000.safetensors", -1)
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="fast"):
        loaded = ckpt.load()
    assert loaded.tier == "durable"
    assert torch.equal(loaded.state["w"], torch.arange(4096.0))  # type: ignore[index]
    assert ckpt.wait_replicated(timeout=60)
    again = ckpt.load()  # no warning: the fast copy was confirmed damaged, set aside, re-copied
    assert again.tier == "fast"
    assert any(".rejected-" in p.name for p in _dir(two_tier, "fast", 1).parent.iterdir())


def test_announce_makes_copies_yield(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r")
    ckpt.announce(seconds_until_save=0.0, nbytes=1 << 20)
    assert service_for(two_tier).gate.busy
    ckpt.save(1, {"w": torch.ones(4)})  # the announced save arrives
    assert not service_for(two_tier).gate.busy
    assert ckpt.wait_replicated(timeout=60)


def test_state_moves_from_committed_to_protected(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(8)}, importance="milestone")
    info = ckpt.info(1)
    assert info is not None and info.state == "committed"
    assert info.protection  # says what is missing
    from mouthguard.jobs.replicator import Replicator  # noqa: PLC0415

    Replicator(two_tier).run_once()
    info = ckpt.info(1)
    assert info is not None and info.state == "protected" and info.protection == ()
    assert info.to_json()["state"] == "protected"


def test_backlog_outlasting_the_save_interval_is_warned(
    two_tier: mouthguard.Store, caplog: pytest.LogCaptureFixture
) -> None:
    from mouthguard.jobs.copy import CopyResult  # noqa: PLC0415
    from mouthguard.jobs.replicator import ReplicationReport  # noqa: PLC0415
    from mouthguard.jobs.service import BackgroundService  # noqa: PLC0415

    clock = FakeClock()
    service = BackgroundService(two_tier, clock=clock)  # not started: driven by hand
    service.notify_commit("r", 1)
    clock.advance(0.05)
    service.notify_commit("r", 2)  # saves 0.05 s apart
    slow = CopyResult("r", 1, "fast", "durable", nbytes=64 << 20, seconds=8.0, yielded_seconds=0.0)
    with caplog.at_level("WARNING"):
        service._record(ReplicationReport(copies=[slow]))  # 8 MiB/s for 64 MiB: ~8 s per copy
    warning = service.status().backlog_warning
    assert warning is not None and "falling behind" in warning
    assert "falling behind" in caplog.text
    fast = CopyResult("r", 2, "fast", "durable", nbytes=1 << 20, seconds=0.01, yielded_seconds=0.0)
    service._record(ReplicationReport(copies=[fast]))
    assert service.status().backlog_warning is None  # small backlogs are not a trend


def test_wait_idle_gives_up_when_its_timeout_passes(two_tier: mouthguard.Store) -> None:
    from mouthguard.jobs.service import BackgroundService  # noqa: PLC0415

    clock = FakeClock()
    service = BackgroundService(two_tier, clock=clock)  # not started: its first pass never runs
    started = clock.monotonic()
    assert not service.wait_idle(timeout=30.0)
    assert clock.monotonic() - started == 30.0
    assert max(clock.waited) <= 0.2  # polls, so a missed notification costs little


def test_the_service_shares_its_clock(two_tier: mouthguard.Store) -> None:
    from mouthguard.jobs.service import BackgroundService  # noqa: PLC0415

    clock = FakeClock()
    service = BackgroundService(two_tier, clock=clock)
    assert service.gate.clock is clock and service.replicator.clock is clock


def test_repair_requests_do_not_count_as_saves(
    two_tier: mouthguard.Store, caplog: pytest.LogCaptureFixture
) -> None:
    from mouthguard.jobs.copy import CopyResult  # noqa: PLC0415
    from mouthguard.jobs.replicator import ReplicationReport  # noqa: PLC0415
    from mouthguard.jobs.service import BackgroundService  # noqa: PLC0415

    clock = FakeClock()
    service = BackgroundService(two_tier, clock=clock)  # not started: driven by hand
    service.notify_commit("r", 1)
    clock.advance(600.0)
    service.notify_commit("r", 2)  # saves ten minutes apart
    interval = service._commit_interval
    assert interval == 600.0
    for step in (1, 2):  # load() and scrub found damage moments later
        clock.advance(0.05)
        service.request_repair("r", step)
    assert service._commit_interval == interval
    assert service.status().queued == 4  # the repairs are queued all the same
    # ~8 s per copy, five copies' worth of backlog: well inside ten minutes between saves.
    slow = CopyResult("r", 1, "fast", "durable", nbytes=64 << 20, seconds=8.0, yielded_seconds=0.0)
    with caplog.at_level("WARNING"):
        service._record(ReplicationReport(copies=[slow]))
    assert service.status().backlog_warning is None
    assert "falling behind" not in caplog.text


def test_the_service_is_the_stores_listener(two_tier: mouthguard.Store) -> None:
    # The wiring (mouthguard/wiring.py) makes it so for every store, without the
    # checkpoint layer importing jobs.
    assert two_tier.listener() is service_for(two_tier)
    from mouthguard.checkpoint.store import Store  # noqa: PLC0415

    plain = Store(two_tier.tiers)  # made below the top-level package: wired all the same
    assert plain.listener() is service_for(plain)
