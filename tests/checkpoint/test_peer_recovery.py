"""Peer memory across real gloo processes: nodes killed (SIGKILL) and restarted.

Four ranks on loopback, grouped into simulated nodes by their node area under
one temporary path. A "node" dies when its ranks are SIGKILLed and its area is
removed (its memory is gone); torchrun would then restart every rank with the
same world size, which the tests do with a second run of the same training.

Training is deterministic (a float update and an integer all-reduce per step),
so a resumed run must end bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import os
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import mouthguard
from mouthguard.errors import RankLostError
from mouthguard.tiers.local import LocalTier
from tests.distributed import DistributedTestError, run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer-memory")]

WORLD = 4
STEPS = 6
#: Seconds a survivor waits for a dead peer before giving up (gloo notices sooner).
TIMEOUT = 20.0


def _initial(rank: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(rank)
    return {"w": torch.randn(4096, generator=gen), "step": 0}


def _train_step(state: dict[str, Any], rank: int, step: int) -> dict[str, Any]:
    total = torch.tensor([step * (rank + 1)], dtype=torch.int64)
    dist.all_reduce(total)  # the ranks interact every step, as training does
    return _update(state, rank, step, int(total.item()))


def _update(state: dict[str, Any], rank: int, step: int, total: int) -> dict[str, Any]:
    # Only exactly rounded operations (integer arithmetic, float multiply and add):
    # torch.sin goes through MKL, whose result in an OpenMP worker thread was seen to
    # differ by about 1e-4 now and then, which would make "bitwise equal" test MKL.
    wave = ((torch.arange(4096) * (step + 7) + rank) % 1009).to(torch.float32) * 1e-3
    w = state["w"] * 0.999 + wave
    return {"w": w + float(total) * 1e-4, "step": step}


def _uninterrupted(rank: int) -> bytes:
    """Rank ``rank``'s final weights had nothing interrupted it (the all-reduce's sum is
    known in closed form: the same float operations in this process)."""
    state: dict[str, Any] = _initial(rank)
    for step in range(1, STEPS + 1):
        state = _update(state, rank, step, step * WORLD * (WORLD + 1) // 2)
    return bytes(state["w"].numpy().tobytes())


def _importance(step: int) -> str:
    return "milestone" if step % 3 == 0 else "routine"  # steps 3 and 6 also go to disk


def _train(
    rank: int,
    world_size: int,
    root: str,
    domains: dict[int, str] | None,
    resume: bool,
    kill_after: int,
    victims: list[int],
    kill_in_send_at: int,
) -> dict[str, object]:
    """Train to STEPS, saving every step; maybe resume first, maybe die on the way."""
    if domains is None:
        os.environ["GROUP_RANK"] = str(rank // 2)  # torchrun's node rank: 2 nodes of 2
    peers = mouthguard.PeerMemory(
        path=Path(root) / "shm", domains=domains, keep=2, timeout=TIMEOUT, chunk_bytes=4096
    )
    store = mouthguard.Store([LocalTier(Path(root) / "disk")])
    ckpt = mouthguard.Checkpointer(
        store, run="job", background=False, collective_timeout=TIMEOUT, peers=peers
    )
    report: dict[str, object] = {}
    state: dict[str, Any] = _initial(rank)
    if resume:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = ckpt.load()
        report["warnings"] = [str(w.message) for w in caught]
        report["loaded"] = (loaded.step, loaded.tier)
        state = loaded.state  # type: ignore[assignment]
    if kill_in_send_at and rank in victims:
        _die_in_the_middle_of_sending(kill_in_send_at)
    try:
        for step in range(int(state["step"]) + 1, STEPS + 1):
            state = _train_step(state, rank, step)
            _sending_step[0] = step
            ckpt.save(step, state, _importance(step))
            if step == kill_after and rank in victims:
                os.kill(os.getpid(), signal.SIGKILL)  # the node dies between two steps
    except (RankLostError, RuntimeError) as exc:  # a peer died: torchrun restarts everyone
        report["lost"] = str(exc)
        return report
    report["final"] = state["w"].numpy().tobytes()
    return report


_sending_step = [0]


def _die_in_the_middle_of_sending(step: int) -> None:
    """SIGKILL this process once its first chunk of a copy of ``step`` was posted."""
    real = dist.isend
    sent = [0]

    def isend(*args: Any, **kwargs: Any) -> Any:
        if _sending_step[0] == step:
            sent[0] += 1
            if sent[0] > 1:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    dist.isend = isend  # type: ignore[assignment]


def _run(root: Path, domains: dict[int, str] | None = None, **kwargs: Any) -> list[Any]:
    settings = {"resume": False, "kill_after": 0, "victims": [], "kill_in_send_at": 0}
    settings.update(kwargs)
    return run_distributed(
        _train,
        WORLD,
        str(root),
        domains,
        settings["resume"],
        settings["kill_after"],
        settings["victims"],
        settings["kill_in_send_at"],
        timeout=90.0,
    )


def _killed(root: Path, domains: dict[int, str] | None = None, **kwargs: Any) -> str:
    """Run a job in which some ranks SIGKILL themselves; the harness's report."""
    with pytest.raises(DistributedTestError) as failed:
        _run(root, domains, **kwargs)
    return str(failed.value)


@pytest.fixture(scope="module")
def uninterrupted() -> list[bytes]:
    """Every rank's final weights after a run that nothing interrupted."""
    return [_uninterrupted(rank) for rank in range(WORLD)]


def _manifests(root: Path, step: int) -> list[str]:
    return sorted(
        p.parent.parent.parent.name
        for p in (root / "shm").glob(f"node-*/job/{step:012d}/manifest.json")
    )


def test_a_lost_node_resumes_from_peer_memory_bitwise(
    tmp_path: Path, uninterrupted: list[bytes]
) -> None:
    report = _killed(tmp_path, kill_after=5, victims=[2, 3])
    assert "exited with code -9" in report
    assert _manifests(tmp_path, 5) == ["node-node0", "node-node1"]
    shutil.rmtree(tmp_path / "shm" / "node-node1")  # the node's memory dies with it
    # The store holds only the milestone (step 3); peer memory the newest two steps.
    assert sorted(p.name for p in (tmp_path / "disk" / "job").iterdir()) == [f"{3:012d}"]
    resumed = _run(tmp_path, resume=True)
    for rank, r in enumerate(resumed):
        assert r["loaded"] == (5, "peers"), r
        assert r["warnings"] == []
        assert r["final"] == uninterrupted[rank], f"rank {rank} diverged"
    # Both nodes hold the newest two steps (the bound); the replacement node got its
    # ranks' step-5 files back from node 0.
    for node in ("node-node0", "node-node1"):
        held = sorted(p.name for p in (tmp_path / "shm" / node / "job").iterdir())
        assert held == [f"{5:012d}", f"{6:012d}"]


def test_losing_every_holder_of_a_rank_falls_back_to_disk(
    tmp_path: Path, uninterrupted: list[bytes]
) -> None:
    # Four nodes of one rank: rank 0's copies live on nodes a and b.
    domains = {0: "a", 1: "b", 2: "c", 3: "d"}
    _killed(tmp_path, domains, kill_after=5, victims=[0, 1])
    shutil.rmtree(tmp_path / "shm" / "node-a")
    shutil.rmtree(tmp_path / "shm" / "node-b")
    resumed = _run(tmp_path, domains, resume=True)
    for rank, r in enumerate(resumed):
        assert r["loaded"] == (3, "local"), r  # the milestone on disk
        assert any(
            "step 5 in peer memory lost every copy of rank(s) [0]" in w
            and "falling back to the store" in w
            for w in r["warnings"]  # type: ignore[attr-defined]
        ), r["warnings"]
        assert r["final"] == uninterrupted[rank], f"rank {rank} diverged"
    # The lost steps were dropped from the surviving nodes; the resumed run saved
    # step 5 again, complete on all four.
    assert _manifests(tmp_path, 5) == ["node-a", "node-b", "node-c", "node-d"]


def test_a_rank_killed_while_sending_its_copies_leaves_that_step_incomplete(
    tmp_path: Path, uninterrupted: list[bytes]
) -> None:
    report = _killed(tmp_path, kill_in_send_at=5, victims=[3])
    assert "exited with code -9" in report
    # The survivors saw the peer go (no hang) and step 5 is nowhere complete,
    # though its files were on their way.
    assert _manifests(tmp_path, 5) == []
    assert _manifests(tmp_path, 4) == ["node-node0", "node-node1"]
    assert list((tmp_path / "shm").glob(f"node-*/job/{5:012d}/rank-*"))
    resumed = _run(tmp_path, resume=True)
    for rank, r in enumerate(resumed):
        assert r["loaded"] == (4, "peers"), r
        assert r["warnings"] == []
        assert r["final"] == uninterrupted[rank], f"rank {rank} diverged"
    assert _manifests(tmp_path, 5) == ["node-node0", "node-node1"]  # saved again, complete


def test_a_damaged_copy_in_peer_memory_sends_every_rank_to_the_store(
    tmp_path: Path, uninterrupted: list[bytes]
) -> None:
    first = _run(tmp_path)
    assert all(r["final"] == uninterrupted[rank] for rank, r in enumerate(first))
    # One bit of rank 0's step-6 file on its own node (the copy it would map).
    path = tmp_path / "shm" / "node-node0" / "job" / f"{6:012d}" / "rank-00000.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    resumed = _run(tmp_path, resume=True)
    for rank, r in enumerate(resumed):
        # Every rank leaves peer memory together (no mix of sources) for the
        # store's step 6, a milestone, and says why.
        assert r["loaded"] == (6, "local"), r
        assert any("could not be loaded from peer memory" in w for w in r["warnings"]), r  # type: ignore[attr-defined]
        assert r["final"] == uninterrupted[rank], f"rank {rank} diverged"
