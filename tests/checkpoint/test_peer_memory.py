"""Peer memory in one process: placement and recovery choice as pure functions, the
node area's bound, and importance deciding what also goes to the store.

The multi-rank stories (copies over gloo, nodes killed and restarted) are in
``test_peer_recovery.py``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.peer_load import choose
from mouthguard.checkpoint.peer_memory import NodeArea
from mouthguard.checkpoint.peer_placement import detect_domain, domains_from_map, holders
from mouthguard.errors import CheckpointExistsError
from mouthguard.tiers.local import LocalTier
from tests.checkpoint.test_signed import KEY, RUN, tamper_and_reseal


def test_each_ranks_copies_land_in_distinct_domains() -> None:
    layouts = [
        ["a", "a", "b", "b"],
        ["a", "b", "c", "d"],
        ["a", "a", "a", "b", "b", "c"],  # uneven nodes
        ["x", "y", "x", "y", "z", "z"],  # domains interleaved by rank
    ]
    for domains, factor in itertools.product(layouts, [1, 2, 3]):
        if factor > len(set(domains)):
            continue
        placed = holders(domains, factor)
        for rank, chosen in enumerate(placed):
            assert chosen[0] == rank
            assert len(chosen) == factor
            assert len({domains[h] for h in chosen}) == factor, (domains, factor, chosen)


def test_the_ring_rule_as_documented() -> None:
    # 2 nodes of 2: each rank's copy goes to the same position on the other node.
    assert holders(["n0", "n0", "n1", "n1"], 2) == [[0, 2], [1, 3], [2, 0], [3, 1]]
    # 4 nodes of 1, three copies: the next two nodes on the ring.
    assert holders(["a", "b", "c", "d"], 3) == [[0, 1, 2], [1, 2, 3], [2, 3, 0], [3, 0, 1]]
    # A bigger node spreads over a smaller one's members (positions wrap).
    assert holders(["a", "a", "a", "b"], 2) == [[0, 3], [1, 3], [2, 3], [3, 0]]


def test_placement_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="needs as many failure domains"):
        holders(["a", "a"], 2)
    with pytest.raises(ValueError, match=">= 1"):
        holders(["a"], 0)
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\]"):
        domains_from_map({0: "a"}, 2)
    with pytest.raises(ValueError, match="replication_factor"):
        mouthguard.PeerMemory(replication_factor=0)
    with pytest.raises(ValueError, match="keep"):
        mouthguard.PeerMemory(keep=0)
    with pytest.raises(ValueError, match="disk_every"):
        mouthguard.PeerMemory(disk_every=-1)


def test_domain_from_the_launcher() -> None:
    assert detect_domain(5, {"GROUP_RANK": "3", "LOCAL_WORLD_SIZE": "2"}) == "node3"
    assert detect_domain(5, {"LOCAL_WORLD_SIZE": "2"}) == "node2"
    assert detect_domain(5, {}) != ""  # the host name


def test_choose_takes_the_newest_step_every_rank_can_get() -> None:
    domains = ["n0", "n0", "n1", "n1"]
    # Node 1 was lost and restarted empty: node 0 holds its ranks' files and copies
    # of ranks 2 and 3 for steps 5 and 6.
    survivor = {5: [0, 1, 2, 3], 6: [0, 1, 2, 3]}
    choice = choose([survivor, survivor, {}, {}], domains)
    assert choice.step == 6
    # Ranks 0-1 read their own node's area; node 0's two ranks share the sending.
    assert choice.sources == {0: 0, 1: 0, 2: 0, 3: 1}
    assert choice.lost == {}
    # Nothing lost: every rank reads from its own node.
    full = {6: [0, 1, 2, 3]}
    assert choose([full] * 4, domains).sources == {0: 0, 1: 0, 2: 2, 3: 2}
    # Step 6 lost rank 3 everywhere: step 5 it is, and step 6's loss is reported.
    partial = {5: [0, 1, 2, 3], 6: [0, 1, 2]}
    choice = choose([partial, partial, {}, {}], domains)
    assert (choice.step, choice.lost) == (5, {6: [3]})
    assert choose([{}, {}, {}, {}], domains).step is None


def _state(step: int) -> dict[str, object]:
    return {"w": torch.arange(1000, dtype=torch.float32) * step, "step": step}


def test_importance_decides_what_also_goes_to_the_store(tmp_path: Path) -> None:
    store = mouthguard.Store([LocalTier(tmp_path / "disk")])
    peers = mouthguard.PeerMemory(
        replication_factor=1, path=tmp_path / "shm", domains={0: "solo"}, keep=2, disk_every=3
    )
    ckpt = mouthguard.Checkpointer(store, run="r", background=False, peers=peers)
    infos = [ckpt.save(1, _state(1), "milestone")]
    infos += [ckpt.save(s, _state(s)) for s in range(2, 6)]  # routine
    handle = ckpt.save_async(6, _state(6), "transient")
    infos.append(handle.result(timeout=60))
    # Milestone: the store too; routine/transient: memory only, but every 3rd also the store.
    assert ckpt.steps() == [1, 4]
    assert ckpt.peer_steps() == [5, 6]  # the node keeps its two newest, whatever the store has
    assert [i.copies[0].tier for i in infos] == [
        "local",
        "peers",
        "peers",
        "local",
        "peers",
        "peers",
    ]
    area = NodeArea(tmp_path / "shm", "solo")
    # Bounded: the two newest complete steps are kept in memory.
    assert mouthguard.Checkpointer(store, run="r", background=False).peer_steps() == []
    held = area.held("r")
    assert [(h.step, h.ranks) for h in held] == [(5, (0,)), (6, (0,))]
    assert all(h.nbytes > 4000 for h in held)
    assert sorted(p.name for p in (area.tier.root / "r").iterdir()) == [
        f"{5:012d}",
        f"{6:012d}",
    ]
    loaded = ckpt.load()
    assert (loaded.step, loaded.tier) == (6, "peers")
    assert torch.equal(loaded.state["w"], _state(6)["w"])  # type: ignore[index]
    with pytest.raises(CheckpointExistsError, match="peer memory"):
        ckpt.save(6, _state(6))
    ckpt.close()


def test_peers_need_the_whole_job(tmp_path: Path) -> None:
    from mouthguard.checkpoint.ranks import RankGroup  # noqa: PLC0415

    with pytest.raises(ValueError, match="whole job"):
        mouthguard.Checkpointer(
            tmp_path, run="r", group=RankGroup(), peers=mouthguard.PeerMemory(replication_factor=1)
        )


def _saved_in_memory(tmp_path: Path) -> mouthguard.Checkpointer:
    """Step 3 (a milestone) in the store and memory; steps 4 and 5 in memory only."""
    store = mouthguard.Store([LocalTier(tmp_path / "disk")])
    peers = mouthguard.PeerMemory(
        replication_factor=1, path=tmp_path / "shm", domains={0: "solo"}, keep=3
    )
    ckpt = mouthguard.Checkpointer(store, run="r", background=False, peers=peers)
    ckpt.save(3, _state(3), "milestone")
    ckpt.save(4, _state(4))
    ckpt.save(5, _state(5))
    return ckpt


def _rank_file(tmp_path: Path, step: int) -> Path:
    return tmp_path / "shm" / "node-solo" / "r" / f"{step:012d}" / "rank-00000.safetensors"


def _mappings_of(root: Path) -> list[str]:
    """Lines of this process's memory map and open descriptors naming a file under ``root``."""
    maps = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(root) in line]
    fds = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:  # closed between the listing and the look
            continue
        if target.startswith(str(root)):
            fds.append(target)
    return maps + fds


def test_a_resume_hands_out_writable_views_of_the_memory_copy(tmp_path: Path) -> None:
    ckpt = _saved_in_memory(tmp_path)
    path = _rank_file(tmp_path, 5)
    before = path.read_bytes()
    loaded = ckpt.load()
    assert (loaded.step, loaded.tier) == (5, "peers")
    w = loaded.state["w"]  # type: ignore[index]
    assert torch.equal(w, _state(5)["w"])
    # No copy: the tensor's bytes are pages of a mapping of the area's file.
    assert any(str(path) in line for line in _mappings_of(tmp_path / "shm"))
    # The caller owns its state: an in-place update (an optimizer step) stays private.
    w.add_(1.0)
    assert torch.equal(w, _state(5)["w"] + 1.0)  # type: ignore[operator]
    assert path.read_bytes() == before
    again = ckpt.load()
    assert torch.equal(again.state["w"], _state(5)["w"])  # type: ignore[index]
    # Released with the last tensor viewing it; no descriptor is held at any point.
    del loaded, w, again
    ckpt.close()
    assert _mappings_of(tmp_path / "shm") == []


def test_a_resume_fills_into_tensors_from_the_memory_copy(tmp_path: Path) -> None:
    ckpt = _saved_in_memory(tmp_path)
    into = {"w": torch.zeros(1000), "step": 0}
    loaded = ckpt.load(into=into)
    assert loaded.state["w"] is into["w"]  # type: ignore[index]
    assert torch.equal(into["w"], _state(5)["w"])  # type: ignore[arg-type]
    assert loaded.state["step"] == 5  # type: ignore[index]
    del loaded
    ckpt.close()
    assert _mappings_of(tmp_path / "shm") == []  # the into= load keeps no mapping


def test_a_damaged_memory_copy_is_refused_and_the_store_used(tmp_path: Path) -> None:
    ckpt = _saved_in_memory(tmp_path)
    path = _rank_file(tmp_path, 5)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.warns(mouthguard.CheckpointFallbackWarning) as caught:
        loaded = ckpt.load()
    messages = [str(w.message) for w in caught]
    assert any("checksum mismatch" in m for m in messages), messages
    assert any("could not be loaded from peer memory" in m for m in messages), messages
    # The store's newest (the milestone), read and verified as usual.
    assert (loaded.step, loaded.tier) == (3, "local")
    assert torch.equal(loaded.state["w"], _state(3)["w"])  # type: ignore[index]
    # The refused copy was unmapped at once: nothing of the area is held.
    assert _mappings_of(tmp_path / "shm") == []
    ckpt.close()


@pytest.mark.parametrize("keep_signature", [False, True])
def test_a_signed_resume_refuses_a_resealed_memory_copy(
    tmp_path: Path, keep_signature: bool
) -> None:
    """The manifest is validated once for the resume, and with the key."""
    store = mouthguard.Store([LocalTier(tmp_path / "disk")])
    peers = mouthguard.PeerMemory(
        replication_factor=1, path=tmp_path / "shm", domains={0: "solo"}, keep=3
    )
    ckpt = mouthguard.Checkpointer(store, run=RUN, background=False, peers=peers, signing_key=KEY)
    ckpt.save(3, _state(3), "milestone")
    ckpt.save(5, _state(5))
    loaded = ckpt.load()
    assert (loaded.step, loaded.tier) == (5, "peers")
    del loaded
    # Someone with write access to /dev/shm but not the key changes a byte and
    # recomputes the checksums into the manifest.
    tamper_and_reseal(NodeArea(tmp_path / "shm", "solo").tier, 5, keep_signature=keep_signature)
    with pytest.warns(mouthguard.CheckpointFallbackWarning) as caught:
        loaded = ckpt.load()
    messages = [str(w.message) for w in caught]
    assert any("could not be loaded from peer memory" in m for m in messages), messages
    assert (loaded.step, loaded.tier) == (3, "local")
    assert torch.equal(loaded.state["w"], _state(3)["w"])  # type: ignore[index]
    ckpt.close()
