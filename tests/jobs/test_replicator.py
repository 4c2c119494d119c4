"""Replication: placement met, every copy read back, damage never propagated."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typing_extensions import override

import mouthguard
from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.sidecars import (
    DAMAGE,
    RECEIPT,
    CopyRef,
    read_sidecars,
    report_damage,
    write_receipt,
)
from mouthguard.errors import FormatError
from mouthguard.jobs import replicator as replicator_module
from mouthguard.jobs.burst import BurstGate
from mouthguard.jobs.copy import SourceDamagedError, copy_checkpoint
from mouthguard.jobs.replicator import ReplicationReport, Replicator, Shortfall
from mouthguard.tiers.base import PutData, PutMode, Tier, iter_buffers
from mouthguard.tiers.posix import get_xattrs
from mouthguard.tiers.throttle import ThrottledTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.checkpoint.helpers import flip_byte
from tests.fake_clock import FakeClock


def _dir(store: mouthguard.Store, tier: str, run: str, step: int) -> Path:
    return Path(store.tier(tier).location(f"{run}/{step:012d}/"))


def test_routine_gets_a_second_verified_copy_in_another_domain(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(1000.0)}, importance="routine")
    report = Replicator(two_tier).run_once()
    assert [(c.source, c.destination) for c in report.copies] == [("fast", "durable")]
    assert report.protected == 1 and not report.shortfalls
    for tier in ("fast", "durable"):
        assert read_sidecars(CopyRef(two_tier.tier(tier), "r", 1)).verified_at is not None
    assert (_dir(two_tier, "fast", "r", 1) / "manifest.json").read_bytes() == (
        _dir(two_tier, "durable", "r", 1) / "manifest.json"
    ).read_bytes()
    # A second pass has nothing to do.
    again = Replicator(two_tier).run_once()
    assert again.copies == [] and again.protected == 1


def test_critical_goes_to_every_durable_tier_with_its_facts(three_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(three_tier, run="r", background=False)
    ckpt.save(7, {"w": torch.ones(10)}, importance="routine")
    ckpt.set_importance(7, "golden", reason="release candidate")
    ckpt.hold(7, "legal", reason="audit")
    report = Replicator(three_tier).run_once()
    assert sorted(c.destination for c in report.copies) == ["archive", "pfs"]
    info = ckpt.info(7)
    assert info is not None
    assert sorted(c.tier for c in info.copies) == ["archive", "fast", "pfs"]
    assert all(c.verified for c in info.copies)
    for tier in ("pfs", "archive"):
        facts = read_sidecars(CopyRef(three_tier.tier(tier), "r", 7))
        assert facts.importance is mouthguard.Importance.CRITICAL
        assert [h.name for h in facts.holds] == ["legal"]
        rank = _dir(three_tier, tier, "r", 7) / "rank-00000.safetensors"
        assert get_xattrs(rank) == {"importance": "critical"}


def test_single_domain_store_reports_the_shortfall(tmp_path: Path) -> None:
    from tests.jobs.conftest import make_store  # noqa: PLC0415

    store = make_store(tmp_path / "one", ("fast", "node-a"), ("other", "node-a"))
    mouthguard.Checkpointer(store, run="r", background=False).save(1, {"w": torch.ones(3)})
    report = Replicator(store).run_once()
    assert report.protected == 0
    assert report.shortfalls and "domain" in report.shortfalls[0].reason


def test_a_damaged_only_copy_is_never_copied_nor_hidden(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(5000.0)})
    flip_byte(_dir(two_tier, "fast", "r", 1) / "rank-00000.safetensors", -3)
    report = Replicator(two_tier).run_once()
    assert report.copies == []
    assert any("no intact copy to repair from: kept" in s.reason for s in report.shortfalls)
    assert not (_dir(two_tier, "durable", "r", 1)).exists()
    run_dir = _dir(two_tier, "fast", "r", 1).parent
    assert [p.name for p in run_dir.iterdir()] == ["000000000001"]  # nothing set aside
    (info,) = ckpt.list()
    assert info.state == "damaged" and "checksum" in info.copies[0].damage.lower()


def test_a_damaged_copy_is_set_aside_and_replaced_when_another_is_intact(
    two_tier: mouthguard.Store,
) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(5000.0)}, importance="milestone")
    assert Replicator(two_tier).run_once().protected == 1
    flip_byte(_dir(two_tier, "fast", "r", 1) / "rank-00000.safetensors", -3)
    with pytest.warns(mouthguard.errors.CheckpointFallbackWarning):
        ckpt.load()  # reads the fast copy, finds the damage, reports it
    report = Replicator(two_tier).run_once()
    assert report.protected == 1 and [c.destination for c in report.copies] == ["fast"]
    names = sorted(
        p.name.split(".")[-1].split("-")[0] for p in _dir(two_tier, "fast", "r", 1).parent.iterdir()
    )
    assert names == ["000000000001", "rejected"]
    assert torch.equal(ckpt.load().state["w"], torch.arange(5000.0))  # type: ignore[index]


def test_copy_source_damage_is_a_distinct_error(two_tier: mouthguard.Store) -> None:
    mouthguard.Checkpointer(two_tier, run="r", background=False).save(1, {"w": torch.arange(100.0)})
    flip_byte(_dir(two_tier, "fast", "r", 1) / "rank-00000.safetensors", -1)
    with pytest.raises(SourceDamagedError, match="corrupt"):
        copy_checkpoint(two_tier.tier("fast"), two_tier.tier("durable"), "r", 1)
    assert not list(Path(two_tier.tier("durable").location()).rglob("manifest.json"))


class _CorruptingTier(ThrottledTier):
    """Writes go through, but one byte of every object written is flipped (bit rot on write)."""

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> object:  # type: ignore[override]
        blob = bytearray(b"".join(bytes(c) for c in iter_buffers(data)))
        if blob and not key.endswith(".json"):
            blob[len(blob) // 2] ^= 0xFF
        return self.inner.put(key, bytes(blob), mode=mode)


def test_read_back_failure_on_destination_does_not_blame_the_source(
    two_tier: mouthguard.Store,
) -> None:
    mouthguard.Checkpointer(two_tier, run="r", background=False).save(1, {"w": torch.arange(100.0)})
    bad = _CorruptingTier(two_tier.tier("durable"), write_bytes_per_second=1e12)
    with pytest.raises(FormatError) as caught:
        copy_checkpoint(two_tier.tier("fast"), bad, "r", 1)
    assert not isinstance(caught.value, SourceDamagedError)
    assert (_dir(two_tier, "fast", "r", 1) / "manifest.json").exists()  # source untouched
    assert not (_dir(two_tier, "durable", "r", 1) / "manifest.json").exists()  # bad copy set aside


def test_a_missing_fast_copy_is_repaired_from_the_durable_one(two_tier: mouthguard.Store) -> None:
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.arange(10.0)}, importance="milestone")
    Replicator(two_tier).run_once()
    (_dir(two_tier, "fast", "r", 1) / "rank-00000.safetensors").unlink()
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="fast"):
        loaded = ckpt.load()
    assert loaded.step == 1 and loaded.tier == "durable"
    report = Replicator(two_tier).run_once()
    assert [(c.source, c.destination) for c in report.copies] == [("durable", "fast")]
    assert ckpt.load().tier == "fast"


def test_copying_yields_to_a_save_in_flight(two_tier: mouthguard.Store) -> None:
    mouthguard.Checkpointer(two_tier, run="r", background=False).save(
        1, {"w": torch.zeros(1 << 20)}
    )
    clock = FakeClock()
    gate = BurstGate(clock=clock)
    gate.save_started()
    durable = Path(two_tier.tier("durable").location())
    written_meanwhile: list[int] = []

    def save_finishes() -> None:
        # The copy is parked before its first chunk: not a byte of it on the destination
        # (only its intent in the audit trail, a few hundred bytes).
        copied = [p for p in durable.rglob("*") if p.is_file() and "_audit" not in p.parts]
        written_meanwhile.append(sum(p.stat().st_size for p in copied))
        gate.save_finished()

    clock.call_later(7.5, save_finishes)
    result = copy_checkpoint(two_tier.tier("fast"), two_tier.tier("durable"), "r", 1, gate=gate)
    assert written_meanwhile == [0]
    assert (_dir(two_tier, "durable", "r", 1) / "manifest.json").exists()
    assert result.yielded_seconds == gate.yielded_seconds == 7.5


def test_wait_protected_retries_until_the_copy_is_made(two_tier: mouthguard.Store) -> None:
    mouthguard.Checkpointer(two_tier, run="r", background=False).save(1, {"w": torch.ones(8)})
    clock = FakeClock()
    replicator = Replicator(two_tier, clock=clock)
    durable = two_tier.tier("durable")
    attempts: list[float] = []
    real_replicate = replicator.replicate

    def replicate(
        run: str, step: int, report: ReplicationReport | None = None
    ) -> ReplicationReport:
        attempts.append(clock.monotonic())
        if len(attempts) < 3:  # the durable tier is unreachable for the first two attempts
            return ReplicationReport(shortfalls=[Shortfall(run, step, f"{durable.name} down")])
        return real_replicate(run, step, report)

    replicator.replicate = replicate  # type: ignore[method-assign]
    started = clock.monotonic()
    assert replicator.wait_protected("r", 1, timeout=60.0)
    assert [t - started for t in attempts] == [0.0, 0.5, 1.0]
    assert clock.slept == [0.5, 0.5]


def test_wait_protected_gives_up_at_the_timeout(tmp_path: Path) -> None:
    from tests.jobs.conftest import make_store  # noqa: PLC0415

    store = make_store(tmp_path / "one", ("fast", "node-a"), ("other", "node-a"))
    mouthguard.Checkpointer(store, run="r", background=False).save(1, {"w": torch.ones(3)})
    clock = FakeClock()
    started = clock.monotonic()
    # One failure domain: the placement can never be met.
    assert not Replicator(store, clock=clock).wait_protected("r", 1, timeout=1.25)
    assert clock.slept == [0.5, 0.5, 0.25]
    assert clock.monotonic() - started == 1.25


def _never(_: object) -> Iterator[bytes]:  # pragma: no cover - keeps Tier imported for typing
    yield b""


_ = (Tier, _never)


class _ReadClock(WrappedTier):
    """Records the fake time of every read of a rank file (manifests and sidecars aside)."""

    def __init__(self, inner: Tier, clock: FakeClock) -> None:
        super().__init__(inner)
        self.clock = clock
        self.reads: list[float] = []

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._saw(key)
        return super().get(key, start, end)

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._saw(key)
        super().read_into(key, offset, out)

    def _saw(self, key: str) -> None:
        if key.endswith(".safetensors"):
            self.reads.append(self.clock.monotonic())


def test_every_read_of_a_replication_waits_for_the_save_in_flight(tmp_path: Path) -> None:
    # Confirming the new copy, copying it and reading the copy back each read the
    # whole checkpoint: none of them may start while a save is in flight.
    from tests.jobs.conftest import make_store  # noqa: PLC0415

    plain = make_store(tmp_path / "s", ("fast", "node-a"), ("durable", "node-b"))
    mouthguard.Checkpointer(plain, run="r", background=False).save(1, {"w": torch.ones(1 << 16)})
    clock = FakeClock()
    fast, durable = (_ReadClock(plain.tier(n), clock) for n in ("fast", "durable"))
    store = mouthguard.Store([fast, durable], policy=plain.policy)
    gate = BurstGate(clock=clock)
    gate.save_started()
    clock.call_later(4.0, gate.save_finished)
    finished = clock.monotonic() + 4.0
    report = Replicator(store, gate=gate, clock=clock).replicate("r", 1)
    assert [c.destination for c in report.copies] == ["durable"]
    assert fast.reads and durable.reads  # the source was read, the copy read back
    assert min(fast.reads + durable.reads) >= finished
    assert gate.yielded_seconds == 4.0


def test_a_receipt_beside_a_damage_report_vouches_for_nothing(
    two_tier: mouthguard.Store,
) -> None:
    """Both facts side by side (a crash between writing one and deleting the other, or a
    receipt written after the report): the copy reads as not verified, the checkpoint as
    not protected, and the damage is what is shown."""
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(64)})
    Replicator(two_tier).run_once()
    assert ckpt.info(1).state == "protected"  # type: ignore[union-attr]
    durable = CopyRef(two_tier.tier("durable"), "r", 1)
    now = dt.datetime.now(dt.UTC)
    report_damage(durable, "a reader saw a checksum mismatch", now)
    write_receipt(durable, durable.tier.get(catalog.manifest_key("r", 1)), now)
    assert durable.tier.exists(durable.key(RECEIPT)) and durable.tier.exists(durable.key(DAMAGE))
    assert read_sidecars(durable).verified_at is None
    info = ckpt.info(1)
    assert info is not None and info.state != "protected"
    (copy,) = [c for c in info.copies if c.tier == "durable"]
    assert not copy.verified and "checksum mismatch" in copy.damage


def test_a_copy_another_replicator_made_meanwhile_is_no_shortfall(
    two_tier: mouthguard.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trainers' services on one store: the other one commits the copy between this
    pass's look at the destination and its own commit."""
    ckpt = mouthguard.Checkpointer(two_tier, run="r", background=False)
    ckpt.save(1, {"w": torch.ones(64)})
    real = replicator_module.copy_checkpoint

    def raced(src: Tier, dst: Tier, run: str, step: int, **kw: object) -> object:
        real(src, dst, run, step)  # the rival's copy lands first
        return real(src, dst, run, step, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(replicator_module, "copy_checkpoint", raced)
    report = Replicator(two_tier).run_once()
    assert report.shortfalls == []
    assert ckpt.info(1).state == "protected"  # type: ignore[union-attr]
