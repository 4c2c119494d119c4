"""FaultyTier: transparent at rate 0 (conformance suite), and each fault does what it says."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from mouthguard import Checkpointer, Store
from mouthguard.errors import (
    CheckpointFallbackWarning,
    DurabilityError,
    NoValidCheckpointError,
    ObjectNotFoundError,
    TierError,
)
from mouthguard.jobs.replicator import Replicator
from mouthguard.testing.conformance import TierConformance, payload
from mouthguard.tiers.base import OPERATIONS, PutMode, StableChunks, Tier, operations_of
from mouthguard.tiers.faults import (
    COMPOSED,
    OPS,
    ConfinementError,
    FaultEvent,
    FaultPlan,
    FaultyTier,
    InjectedDurabilityError,
    InjectedFaultError,
    InjectedNoSpaceError,
    unwrap,
)
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.fake_clock import FakeClock


class TestFaultyMemoryTier(TierConformance):
    @pytest.fixture
    def make_tier(self) -> Callable[[], Tier]:
        return lambda: FaultyTier(MemoryTier(), FaultPlan())


class TestFaultyLocalTier(TierConformance):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Callable[[], Tier]:
        return lambda: FaultyTier(LocalTier(tmp_path / "root"), FaultPlan(), seed=3)


# --- the plan --------------------------------------------------------------------


def test_plan_parses_the_cli_spec() -> None:
    plan = FaultPlan.parse("error=0.05,enospc=0.02,flip=0.01,torn=0.01,delay=0.1:0.005")
    assert plan == FaultPlan(
        error=0.05, enospc=0.02, flip=0.01, torn=0.01, delay=0.1, delay_seconds=0.005
    )
    assert FaultPlan.parse(plan.spec()) == plan
    assert FaultPlan.parse("") == FaultPlan()
    assert FaultPlan.parse(" short = 1 , fsync=0.5 ") == FaultPlan(short=1.0, fsync=0.5)
    assert FaultPlan().spec() == ""
    assert FaultPlan(torn=0.1).silent and not FaultPlan(flip=1).silent
    narrow = FaultPlan.parse("flip=1,ops=read_into+get,keys=rank-")
    assert narrow == FaultPlan(flip=1.0, ops=frozenset({"get", "read_into"}), keys="rank-")
    assert FaultPlan.parse(narrow.spec()) == narrow
    assert narrow.applies_to("get", "r/1/rank-00000.safetensors")
    assert not narrow.applies_to("get", "r/1/manifest.json")
    assert not narrow.applies_to("put", "r/1/rank-00000.safetensors")


@pytest.mark.parametrize(
    "spec",
    ["bogus=0.1", "error", "error=2", "error=-0.1", "error=x", "flip=0.1:3", "delay=0.1:-1",
     "error=0.1,error=0.2", "error=nan", "error=0.1,ops=get+fly"],
)  # fmt: skip
def test_plan_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=r"fault|delay|rate|operations"):
        FaultPlan.parse(spec)


# --- the wrapper keeps the inner tier's identity ---------------------------------------


def test_wrapper_keeps_name_domain_capabilities_location(tmp_path: Path) -> None:
    inner = LocalTier(tmp_path / "t", name="fast", domain="node-a")
    tier = FaultyTier(inner, FaultPlan(error=0.5))
    assert (tier.name, tier.domain, tier.capabilities) == ("fast", "node-a", inner.capabilities)
    assert tier.location("a/b") == inner.location("a/b")
    assert unwrap(FaultyTier(tier, FaultPlan())) is inner
    assert "error=0.5" in repr(tier) and "fast" in repr(tier)


# --- each fault ------------------------------------------------------------------------


def _one_call_each(tier: Tier) -> dict[str, Callable[[], object]]:
    """One call of every tier operation, keyed by its name, on a tier holding ``k``."""
    return {
        "put": lambda: tier.put("new", b"x"),
        "get": lambda: tier.get("k"),
        "read_into": lambda: tier.read_into("k", 0, memoryview(bytearray(1))),
        "head": lambda: tier.head("k"),
        "exists": lambda: tier.exists("k"),
        "list": lambda: tier.list(""),
        "list_info": lambda: tier.list_info(""),
        "list_dirs": lambda: tier.list_dirs(""),
        "delete": lambda: tier.delete("k"),
        "rename_prefix": lambda: tier.rename_prefix("a", "b"),
        "delete_prefix": lambda: tier.delete_prefix("k/"),
        "annotate": lambda: tier.annotate("k", {"a": "b"}),
        "annotations": lambda: tier.annotations("k"),
        "set_legal_hold": lambda: tier.set_legal_hold("k", True),
        "collect_incomplete": lambda: tier.collect_incomplete("", 0),
    }


def test_the_operations_are_derived_from_tier() -> None:
    """A method added to ``Tier`` joins OPERATIONS, and fault injection must then cover it."""
    assert set(_one_call_each(MemoryTier())) == set(OPERATIONS)
    assert set(OPS) == set(OPERATIONS) - COMPOSED
    for op in OPERATIONS:
        # Each wrapper forwards or intercepts it, rather than inheriting Tier's default.
        assert op in vars(WrappedTier), f"WrappedTier does not forward {op}"
        assert op in vars(FaultyTier), f"FaultyTier does not cover {op}"

    class Extended(MemoryTier):
        def compact(self) -> int:
            return 0

    assert "compact" in operations_of(Extended)
    assert "location" not in OPERATIONS and "capabilities" not in OPERATIONS


def test_errors_hit_every_operation_before_the_inner_tier() -> None:
    inner = MemoryTier()
    inner.put("k", b"v")
    tier = FaultyTier(inner, FaultPlan(error=1.0))
    calls = _one_call_each(tier)
    for call in calls.values():
        with pytest.raises(InjectedFaultError):
            call()
    assert tier.injected == {"error": len(calls)}
    assert list(inner.list()) == ["k"] and inner.get("k") == b"v"  # nothing reached it
    assert tier.events[0] == FaultEvent("error", "put", "new")


@pytest.mark.parametrize("op", OPS)
def test_a_plan_narrowed_to_one_operation_hits_only_it(op: str) -> None:
    inner = MemoryTier()
    inner.put("k", b"v")
    inner.put("k/x", b"w")  # so that delete_prefix("k/") reaches a delete
    tier = FaultyTier(inner, FaultPlan(error=1.0, ops=frozenset({op})))
    for name, call in _one_call_each(tier).items():
        if name == op or (name in COMPOSED and op in {"list", "delete"}):
            with pytest.raises(InjectedFaultError):
                call()
        else:
            try:
                call()
            except InjectedFaultError:  # pragma: no cover - the failure message
                pytest.fail(f"a plan narrowed to {op} injected into {name}")
            except TierError:
                pass  # the inner tier's own refusal (rename on a RAM tier), not a fault


def test_same_seed_same_faults() -> None:
    def outcomes(seed: int) -> list[bool]:
        tier = FaultyTier(MemoryTier(), FaultPlan(error=0.3), seed=seed)
        result = []
        for i in range(200):
            try:
                tier.put(f"k{i}", b"x")
                result.append(True)
            except InjectedFaultError:
                result.append(False)
        return result

    assert outcomes(1) == outcomes(1)
    assert outcomes(1) != outcomes(2)
    assert 30 < outcomes(1).count(False) < 90  # about 30 %


@pytest.mark.parametrize("stable", [False, True])
def test_enospc_publishes_nothing(tmp_path: Path, stable: bool) -> None:
    inner = LocalTier(tmp_path / "t")
    inner.put("keep", b"old")
    tier = FaultyTier(inner, FaultPlan(enospc=1.0), seed=7)
    data = payload(300_000, seed=1)
    chunks = [data[i : i + 50_000] for i in range(0, len(data), 50_000)]
    for key in ("keep", "fresh/obj"):
        with pytest.raises(InjectedNoSpaceError, match="No space left"):
            tier.put(key, StableChunks(chunks) if stable else iter(chunks))
        with pytest.raises(InjectedNoSpaceError):
            tier.put(key, b"tiny", mode=PutMode.OVERWRITE)  # fails at the final flush
    assert tier.injected == {"enospc": 4}
    assert inner.get("keep") == b"old"
    assert list(inner.list()) == ["keep"]
    assert not any((tmp_path / "t").rglob(".tmp-*"))  # no debris left behind either


def test_torn_write_is_acknowledged_with_zeros_of_the_right_size() -> None:
    inner = MemoryTier()
    tier = FaultyTier(inner, FaultPlan(torn=1.0), seed=2)
    data = b"\xff" * 1000
    info = tier.put("obj", [data[:400], data[400:]])
    assert info.size == 1000
    stored = inner.get("obj")
    assert len(stored) == 1000 and stored != data
    cut = stored.index(0)
    assert stored[:cut] == data[:cut] and stored[cut:] == bytes(1000 - cut)
    assert tier.injected == {"torn": 1}
    # Zeros torn off zeros change nothing: not counted as a fault.
    tier.put("zeros", bytes(100))
    tier.put("empty", b"")
    assert tier.injected == {"torn": 1}


def test_short_write_is_acknowledged_with_the_full_size() -> None:
    inner = MemoryTier()
    tier = FaultyTier(inner, FaultPlan(short=1.0), seed=4)
    data = payload(5000, seed=9)
    assert tier.put("obj", data).size == 5000  # the storage does not know
    stored = inner.get("obj")
    assert len(stored) < 5000 and data.startswith(stored)
    assert tier.head("obj").size == len(stored)  # but a later head tells
    assert tier.injected == {"short": 1}


def test_bit_flips_on_read_leave_the_stored_bytes_intact() -> None:
    inner = MemoryTier()
    data = payload(4096, seed=5)
    inner.put("obj", data)
    tier = FaultyTier(inner, FaultPlan(flip=1.0), seed=1)
    got = tier.get("obj")
    diff = [a ^ b for a, b in zip(got, data, strict=True) if a != b]
    assert len(diff) == 1 and bin(diff[0]).count("1") == 1
    out = bytearray(100)
    tier.read_into("obj", 10, memoryview(out))
    diff = [a ^ b for a, b in zip(out, data[10:110], strict=True) if a != b]
    assert len(diff) == 1 and bin(diff[0]).count("1") == 1
    words = memoryview(bytearray(8)).cast("H")
    tier.read_into("obj", 0, words)
    assert words.tobytes() != data[:8]
    assert tier.get("obj", 5, 5) == b""  # nothing to flip in an empty read
    assert tier.injected == {"flip": 3}
    assert inner.get("obj") == data


def test_fsync_failure_after_the_inner_put() -> None:
    inner = MemoryTier()
    tier = FaultyTier(inner, FaultPlan(fsync=1.0))
    with pytest.raises(InjectedDurabilityError) as excinfo:
        tier.put("obj", b"data")
    assert isinstance(excinfo.value, DurabilityError)
    assert inner.get("obj") == b"data"  # visible, as after a failed fsync: not durable
    assert tier.injected == {"fsync": 1}


def test_delays() -> None:
    clock = FakeClock()
    tier = FaultyTier(MemoryTier(), FaultPlan(delay=1.0, delay_seconds=0.02), clock=clock)
    tier.put("a", b"x")
    assert tier.get("a") == b"x"
    assert clock.slept == [0.02, 0.02]
    assert tier.injected == {"delay": 2}


def test_enabled_false_pauses_injection() -> None:
    tier = FaultyTier(MemoryTier(), FaultPlan(error=1.0, flip=1.0))
    tier.enabled = False
    tier.put("a", b"x")
    assert tier.get("a") == b"x"
    assert not tier.injected


def test_delete_prefix_goes_through_the_faults_key_by_key() -> None:
    inner = MemoryTier()
    for i in range(50):
        inner.put(f"p/{i:02d}", b"x")
    tier = FaultyTier(inner, FaultPlan(error=0.2), seed=11)

    def delete_all() -> None:
        for _ in range(10):
            tier.delete_prefix("p/")

    with pytest.raises(InjectedFaultError):
        delete_all()
    # The bulk delete stopped part-way (what an object store's bulk delete can do).
    assert 0 < len(list(inner.list("p/"))) < 50


def test_confinement_refuses_and_records_writes_outside() -> None:
    inner = MemoryTier()
    inner.put("other/k", b"precious")
    tier = FaultyTier(inner, FaultPlan(), confine_to="chaos/")
    tier.put("chaos/a", b"ok")
    writes: list[Callable[[], object]] = [
        lambda: tier.put("other/k", b"x"),
        lambda: tier.delete("other/k"),
        lambda: tier.rename_prefix("chaos/a", "other/b"),
        lambda: tier.annotate("other/k", {"a": "b"}),
        lambda: tier.set_legal_hold("other/k", True),
        lambda: tier.collect_incomplete("", 0),
    ]
    for write in writes:
        with pytest.raises(ConfinementError):
            write()
    assert tier.outside == ["other/k", "other/k", "other/b", "other/k", "other/k", ""]
    assert inner.get("other/k") == b"precious"
    assert tier.get("other/k") == b"precious"  # reads are free
    assert not tier.injected  # a refusal is not an injected fault
    with pytest.raises(ObjectNotFoundError):
        tier.get("chaos/missing")


def test_an_exempt_prefix_gets_no_faults_and_passes_the_confinement() -> None:
    inner = MemoryTier()
    tier = FaultyTier(inner, FaultPlan(error=1.0), confine_to="chaos/", exempt="_audit/")
    tier.put("_audit/000000000000.json", b"record")  # outside chaos/, exempt: allowed
    assert tier.get("_audit/000000000000.json") == b"record"
    with pytest.raises(InjectedFaultError):
        tier.get("chaos/a")
    with pytest.raises(ConfinementError):
        tier.put("other/k", b"x")
    assert tier.outside == ["other/k"]


def test_injected_errors_are_transient_tier_errors() -> None:
    from mouthguard.errors import is_data_damage  # noqa: PLC0415

    for exc in (InjectedFaultError("x"), InjectedNoSpaceError("x"), InjectedDurabilityError("x")):
        assert isinstance(exc, TierError) and not is_data_damage(exc)


def test_torn_put_through_a_failing_stream_still_raises() -> None:
    tier = FaultyTier(MemoryTier(), FaultPlan(torn=1.0))

    def broken() -> Iterator[bytes]:
        yield b"x" * 10
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError, match="source died"):
        tier.put("k", broken())
    assert not tier.exists("k") and not tier.injected


def test_ops_and_keys_narrow_the_faults() -> None:
    inner = MemoryTier()
    tier = FaultyTier(inner, FaultPlan(error=1.0, ops=frozenset({"get"}), keys="rank-"))
    tier.put("r/rank-0", b"x")
    tier.put("r/manifest.json", b"m")
    assert tier.get("r/manifest.json") == b"m"
    with pytest.raises(InjectedFaultError):
        tier.get("r/rank-0")
    assert tier.injected == {"error": 1}


# --- end to end: a Checkpointer over a faulty fast tier ------------------------------


def _state(step: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(step)
    return {"w": torch.randn(512 + step, generator=gen), "step": step}


def _same(got: object, step: int) -> bool:
    want = _state(step)
    assert isinstance(got, dict)
    return bool(torch.equal(got["w"], want["w"])) and got["step"] == step


def _stores(tmp_path: Path, plan: FaultPlan, seed: int = 0) -> tuple[Store, Store, FaultyTier]:
    """(faulty store, clean store over the same directories, the faulty fast tier)."""
    fast = LocalTier(tmp_path / "fast", name="fast", domain="node-a")
    durable = LocalTier(tmp_path / "durable", name="durable", domain="node-b")
    faulty = FaultyTier(fast, plan, seed=seed)
    return Store([faulty, durable]), Store([fast, durable]), faulty


def _visible_dirs(tmp_path: Path, run: str) -> list[str]:
    """Step directories a reader could take for checkpoints (not partial or set aside)."""
    root = tmp_path / "fast" / run
    return sorted(p.name for p in root.iterdir() if "." not in p.name) if root.is_dir() else []


def test_injected_errors_fail_saves_cleanly(tmp_path: Path) -> None:
    store, clean, faulty = _stores(tmp_path, FaultPlan(error=0.15, enospc=0.1), seed=5)
    ckpt = Checkpointer(store, "r", background=False)
    acknowledged, failed = [], []
    for step in range(1, 41):
        try:
            ckpt.save(step, _state(step))
            acknowledged.append(step)
        except TierError:
            failed.append(step)
        # Nothing committed for a failed save, nothing partial visible, at any moment.
        assert _visible_dirs(tmp_path, "r") == [f"{s:012d}" for s in acknowledged]
    assert acknowledged and failed and faulty.injected["error"] and faulty.injected["enospc"]
    judge = Checkpointer(clean, "r", background=False)
    assert judge.steps() == acknowledged
    for step in acknowledged:
        assert _same(judge.load(step).state, step)
    faulty.enabled = False
    ckpt.save(41, _state(41))  # the next save works
    assert _same(judge.load().state, 41)
    judge.collect_garbage(grace_seconds=0.0)  # what failed cleanups left is collected
    assert sorted(p.name for p in (tmp_path / "fast" / "r").iterdir()) == [
        f"{s:012d}" for s in [*acknowledged, 41]
    ]


def test_bit_flips_on_read_never_reach_the_caller(tmp_path: Path) -> None:
    store, clean, faulty = _stores(tmp_path, FaultPlan(flip=0.3), seed=2)
    faulty.enabled = False
    ckpt = Checkpointer(store, "r", background=False)
    for step in range(1, 6):
        ckpt.save(step, _state(step))
    Replicator(clean).run_once()  # every step also on durable, verified
    faulty.enabled = True
    tiers: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        for _ in range(60):
            loaded = ckpt.load()
            assert _same(loaded.state, loaded.step)  # never wrong bytes
            assert loaded.step == 5  # the durable copy stands in for a flipped read
            tiers.add(loaded.tier)
            assert all(r.tier == "fast" for r in loaded.rejected)
    assert tiers == {"fast", "durable"} and faulty.injected["flip"] > 0


def test_bit_flips_fall_back_to_an_older_step_with_one_copy(tmp_path: Path) -> None:
    fast = FaultyTier(LocalTier(tmp_path / "fast"), FaultPlan(flip=0.5), seed=4)
    fast.enabled = False
    ckpt = Checkpointer(Store([fast]), "r", background=False)
    for step in range(1, 4):
        ckpt.save(step, _state(step))
    fast.enabled = True
    outcomes: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        for _ in range(40):
            try:
                loaded = ckpt.load()
            except NoValidCheckpointError:
                outcomes.add("none valid")
                continue
            assert _same(loaded.state, loaded.step)
            outcomes.add("fallback" if loaded.step < 3 else "newest")
    assert {"fallback", "newest"} <= outcomes


@pytest.mark.parametrize("kind", ["torn", "short"])
def test_acknowledged_torn_writes_are_rejected_by_checksum(tmp_path: Path, kind: str) -> None:
    plan = FaultPlan(**{kind: 1.0}, keys="rank-")  # type: ignore[arg-type]
    store, clean, faulty = _stores(tmp_path, plan, seed=1)
    faulty.enabled = False
    ckpt = Checkpointer(store, "r", background=False)
    ckpt.save(1, _state(1))
    faulty.enabled = True
    ckpt.save(2, _state(2))  # acknowledged: the storage lied
    assert faulty.injected == {kind: 1}
    # Caught by the size check, the header check or the checksum, wherever the cut fell.
    with pytest.warns(CheckpointFallbackWarning, match="size is|header|checksum"):
        loaded = Checkpointer(clean, "r", background=False).load()
    assert loaded.step == 1 and _same(loaded.state, 1)
    assert [(r.step, r.tier) for r in loaded.rejected] == [(2, "fast")]
    # The replicator never propagates it; with no intact copy to repair from it stays
    # in place, listed as damaged. Step 1 goes to durable.
    report = Replicator(clean).run_once()
    assert [(c.step, c.destination) for c in report.copies] == [(1, "durable")]
    listed = Checkpointer(clean, "r", background=False).list()
    assert [(i.step, i.state) for i in listed] == [(1, "protected"), (2, "damaged")]


@pytest.mark.parametrize("kind", ["torn", "short"])
def test_a_torn_copy_falls_back_to_the_durable_copy_of_the_same_step(
    tmp_path: Path, kind: str
) -> None:
    plan = FaultPlan(**{kind: 1.0}, keys="rank-")  # type: ignore[arg-type]
    store, clean, faulty = _stores(tmp_path, plan, seed=3)
    # An intact copy of step 7 on durable (saved there directly), a torn one on fast.
    Checkpointer(Store([clean.tier("durable")]), "r", background=False).save(7, _state(7))
    Checkpointer(store, "r", background=False).save(7, _state(7))
    assert faulty.injected == {kind: 1}
    with pytest.warns(CheckpointFallbackWarning):
        loaded = Checkpointer(clean, "r", background=False).load()
    assert (loaded.step, loaded.tier) == (7, "durable") and _same(loaded.state, 7)


def test_torn_replica_is_caught_by_the_read_back(tmp_path: Path) -> None:
    fast = LocalTier(tmp_path / "fast", name="fast", domain="node-a")
    durable = FaultyTier(
        LocalTier(tmp_path / "durable", name="durable", domain="node-b"),
        FaultPlan(torn=1.0, keys="rank-"),
    )
    Checkpointer(Store([fast, durable]), "r", background=False).save(1, _state(1))
    report = Replicator(Store([fast, durable])).run_once()
    assert report.copies == [] and durable.injected == {"torn": 1}
    assert any("read-back" in s.reason or "copy" in s.reason for s in report.shortfalls)
    assert not durable.exists("r/000000000001/manifest.json")  # set aside, not counted
    durable.enabled = False
    assert Replicator(Store([fast, durable])).run_once().protected == 1


@pytest.mark.parametrize("keys", ["rank-", "manifest.json"])
def test_fsync_failure_fails_the_save_and_commits_nothing(tmp_path: Path, keys: str) -> None:
    store, clean, faulty = _stores(tmp_path, FaultPlan(fsync=1.0, keys=keys))
    ckpt = Checkpointer(store, "r", background=False)
    with pytest.raises(DurabilityError):
        ckpt.save(1, _state(1))
    with pytest.raises(DurabilityError):
        ckpt.save_async(2, _state(2)).result()
    assert faulty.injected == {"fsync": 2}
    assert Checkpointer(clean, "r", background=False).steps() == []
    assert _visible_dirs(tmp_path, "r") == []
    faulty.enabled = False
    ckpt.save(1, _state(1))
    assert _same(Checkpointer(clean, "r", background=False).load().state, 1)
    ckpt.close()
