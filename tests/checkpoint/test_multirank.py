"""Multi-rank saves and loads through real torch.distributed (gloo) processes.

Each test is one spawn of N ranks (about two seconds each), so each checks a
whole story: sync and async saves, the files on disk, loads with agreement and
fallback, a failing rank.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import mouthguard
from mouthguard.checks import CheckInput
from mouthguard.errors import (
    RankFailedError,
    StateMismatchError,
    TierError,
    UnsupportedStateError,
)
from mouthguard.format.manifest import Manifest
from mouthguard.tiers.local import LocalTier
from tests.checkpoint.helpers import flip_byte, step_path
from tests.distributed import run_distributed


def _rank_state(rank: int, step: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return {
        "model": {"shard": torch.randn(64 + rank, 32, generator=gen)},
        "rank": rank,
        "step": step,
        "names": [f"r{rank}", "shared"],
    }


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    return (
        torch.equal(a["model"]["shard"], b["model"]["shard"])  # type: ignore[index]
        and a["rank"] == b["rank"]
        and a["step"] == b["step"]
        and a["names"] == b["names"]
    )


def _save_load_story(rank: int, world_size: int, root: str) -> dict[str, object]:
    store = mouthguard.Store([LocalTier(Path(root) / "fast")])
    ckpt = mouthguard.Checkpointer(store, run="job", background=False)
    report: dict[str, object] = {"ranks": ckpt.ranks.world_size}
    info = ckpt.save(10, _rank_state(rank, 10), importance="milestone")
    report["sync_world_size"] = info.world_size
    state = _rank_state(rank, 20)
    handle = ckpt.save_async(20, state)
    state["model"]["shard"].add_(1)  # type: ignore[index]  # training goes on
    report["async_files"] = len(handle.result(timeout=60).files)
    loaded = ckpt.load()
    report["newest"] = loaded.step
    report["newest_is_mine"] = _same(loaded.state, _rank_state(rank, 20))  # type: ignore[arg-type]
    # Damage only the last rank's part of step 20: every rank must fall back together.
    if rank == world_size - 1:
        flip_byte(step_path(store, "job", 20) / f"rank-{rank:05d}.safetensors", -1)
    dist.barrier()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fallback = ckpt.load()
    report["fallback"] = fallback.step
    report["fallback_is_mine"] = _same(fallback.state, _rank_state(rank, 10))  # type: ignore[arg-type]
    into = _rank_state(rank, 0)
    target = into["model"]["shard"]  # type: ignore[index]
    ckpt.load(10, into=into)
    report["into_in_place"] = torch.equal(target, _rank_state(rank, 10)["model"]["shard"])  # type: ignore[index]
    return report


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_rank_saves_its_part_and_loads_it_back(tmp_path: Path, world_size: int) -> None:
    reports = run_distributed(_save_load_story, world_size, str(tmp_path))
    for report in reports:
        assert report == {
            "ranks": world_size,
            "sync_world_size": world_size,
            "async_files": world_size,
            "newest": 20,
            "newest_is_mine": True,
            "fallback": 10,
            "fallback_is_mine": True,
            "into_in_place": True,
        }
    step_dir = tmp_path / "fast" / "job" / f"{10:012d}"
    files = sorted(p.name for p in step_dir.iterdir())
    # world_size + 1 files: one per rank and the manifest (sidecars live elsewhere).
    assert files == sorted(
        [f"rank-{r:05d}.safetensors" for r in range(world_size)] + ["manifest.json"]
    )
    manifest = Manifest.from_bytes((step_dir / "manifest.json").read_bytes())
    assert manifest.world_size == world_size
    assert [f.rank for f in manifest.files] == list(range(world_size))
    assert [s["rank"] for s in manifest.states] == list(range(world_size))  # type: ignore[index]
    # The run has no partial directories left behind.
    assert sorted(p.name for p in (tmp_path / "fast" / "job").iterdir()) == [
        f"{10:012d}",
        f"{20:012d}",
    ]
    # A single process cannot load a 2-rank checkpoint as if it were its own.
    single = mouthguard.Checkpointer(
        mouthguard.Store([LocalTier(tmp_path / "fast")]),
        run="job",
        background=False,
    )
    with pytest.raises(StateMismatchError, match=r"mouthguard\.dcp"):
        single.load(10)


def _failing_rank_story(rank: int, world_size: int, root: str) -> dict[str, str]:
    store = mouthguard.Store([LocalTier(Path(root) / "fast")])
    ckpt = mouthguard.Checkpointer(store, run="job", background=False)
    outcome: dict[str, str] = {}
    bad = dict(_rank_state(rank, 1))
    if rank == 1:
        bad["lock"] = threading.Lock()  # cannot be saved without pickle
    for mode in ("sync", "async"):
        try:
            if mode == "sync":
                ckpt.save(1, bad)
            else:
                ckpt.save_async(2, bad).result(timeout=60)
            outcome[mode] = "saved"
        except UnsupportedStateError:
            outcome[mode] = "own error"
        except RankFailedError as exc:
            outcome[mode] = "peer error" if "rank 1" in str(exc) else f"wrong: {exc}"
    # The group still works: a good save commits on every rank.
    ckpt.save(3, _rank_state(rank, 3))
    outcome["steps"] = ",".join(map(str, ckpt.steps()))
    # A fast tier that is not shared (each rank its own directory) cannot commit.
    private = mouthguard.Store([LocalTier(Path(root) / f"private-{rank}")])
    split = mouthguard.Checkpointer(private, run="job", background=False)
    try:
        split.save(4, _rank_state(rank, 4))
        outcome["private"] = "saved"
    except RankFailedError:
        outcome["private"] = "peer error"
    except TierError as exc:
        outcome["private"] = "not shared" if "shared by every rank" in str(exc) else str(exc)
    outcome["private_steps"] = ",".join(map(str, split.steps()))
    return outcome


def test_a_failing_rank_commits_nothing_and_every_rank_hears_of_it(tmp_path: Path) -> None:
    reports = run_distributed(_failing_rank_story, 3, str(tmp_path))
    for rank, report in enumerate(reports):
        expected = "own error" if rank == 1 else "peer error"
        assert report == {
            "sync": expected,
            "async": expected,
            "steps": "3",
            # The coordinator sees the missing rank files; the others hear of it.
            "private": "not shared" if rank == 0 else "peer error",
            "private_steps": "",
        }, rank
    # Nothing of the failed saves is left: no partial directories.
    assert sorted(p.name for p in (tmp_path / "fast" / "job").iterdir()) == [f"{3:012d}"]


def _nan_on_one_rank(rank: int, world_size: int, root: str) -> dict[str, object]:
    store = mouthguard.Store([LocalTier(Path(root) / "fast")])
    ckpt = mouthguard.Checkpointer(store, run="job", background=False)
    ckpt.save(1, _rank_state(rank, 1))
    bad = _rank_state(rank, 2)
    if rank == 1:
        bad["model"]["shard"][0, 0] = float("nan")  # type: ignore[index]
    ckpt.save(2, bad)  # unguarded: the NaN is committed as a routine checkpoint
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = ckpt.load(check=mouthguard.checks.finite())
    guarded = _rank_state(rank, 3)
    if rank == 0:
        guarded["model"]["shard"][0, 0] = float("inf")  # type: ignore[index]
    with warnings.catch_warnings(record=True) as guard_warnings:
        warnings.simplefilter("always")
        info = ckpt.save(3, guarded, importance="milestone", check=mouthguard.checks.finite())
    return {
        "step": loaded.step,
        "exact": _same(loaded.state, _rank_state(rank, 1)),  # type: ignore[arg-type]
        "warnings": [str(w.message) for w in caught],
        "suspect": ckpt.info(2).suspect,  # type: ignore[union-attr]
        "guard_warned": any("failed the save check" in str(w.message) for w in guard_warnings),
        "saved_as": info.importance.value,
        "then": ckpt.load().step,
    }


def test_a_nan_on_one_rank_makes_every_rank_fall_back_together(tmp_path: Path) -> None:
    results = run_distributed(_nan_on_one_rank, 2, str(tmp_path))
    for rank, result in enumerate(results):
        assert result["step"] == 1, result
        assert result["exact"]
        assert any("rank 1: non-finite" in w for w in result["warnings"]), result  # type: ignore[attr-defined]
        assert "rank 1" in str(result["suspect"])
        # the guard: rank 0's Inf demotes the whole checkpoint, and every rank says so
        assert result["guard_warned"], rank
        assert result["saved_as"] == "transient"
        assert result["then"] == 1  # the suspect 2 and 3 are skipped by a plain resume


def _check_raising_on_rank_1(rank: int, world_size: int, root: str) -> dict[str, str]:
    store = mouthguard.Store([LocalTier(Path(root) / "fast")])
    # A short timeout: were the exception hidden, rank 0 would wait this long in the
    # collective and then report RankLostError (which this test must not see).
    ckpt = mouthguard.Checkpointer(store, run="job", background=False, collective_timeout=20)
    ckpt.save(1, _rank_state(rank, 1))

    def buggy(subject: CheckInput) -> str | None:
        if rank == 1:
            raise ValueError("the check has a bug")
        return None

    outcome: dict[str, str] = {}
    for what, call in (
        ("load", lambda: ckpt.load(check=buggy)),
        ("save", lambda: ckpt.save(2, _rank_state(rank, 2), check=buggy)),
    ):
        try:
            call()
            outcome[what] = "no error"
        except (ValueError, RankFailedError) as exc:
            outcome[what] = f"{type(exc).__name__}: {exc}"
    outcome["steps"] = ",".join(map(str, ckpt.steps()))
    return outcome


def test_a_check_that_raises_on_one_rank_is_reported_on_every_rank(tmp_path: Path) -> None:
    """Not a RankLostError after the timeout: the real exception, named on every rank."""
    results = run_distributed(_check_raising_on_rank_1, 2, str(tmp_path))
    for what in ("load", "save"):
        assert results[1][what] == "ValueError: the check has a bug", results[1]
        assert results[0][what].startswith("RankFailedError"), results[0]
        assert "rank 1: ValueError: the check has a bug" in results[0][what]
    assert results[0]["steps"] == results[1]["steps"] == "1"  # the guarded save committed nothing
