"""A peer resume's remaining costs: a file received in this load is hashed once, a
survivor's own file is hashed once (while the transfers run), and the resume runs
few collectives.

The single-process tests map a committed checkpoint with and without a receipt,
and take receipts by hashing a file in place;
the multi-rank test resumes a real 4-rank gloo job whose second node lost its
area, counting the bytes map_copy hashed and the collectives of the checkpoint
group (TorchRanks.all_gather calls).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint import catalog, mapped_load
from mouthguard.checkpoint.mapped_load import Receipt, hashed_receipt, map_copy
from mouthguard.checkpoint.reader import read_manifest
from mouthguard.errors import ChecksumMismatchError
from mouthguard.format.manifest import Manifest
from mouthguard.tiers.local import LocalTier
from tests.distributed import run_distributed

RUN = "job"


def _saved(root: Path) -> tuple[LocalTier, str, Manifest, Path]:
    """A one-rank checkpoint committed on a local tier; its prefix, manifest and file."""
    tier = LocalTier(root)
    ckpt = mouthguard.Checkpointer(mouthguard.Store([tier]), run=RUN, background=False)
    ckpt.save(1, {"w": torch.arange(4096, dtype=torch.float32)}, "routine")
    manifest = read_manifest(tier, RUN, 1, None)
    prefix = catalog.checkpoint_prefix(RUN, 1)
    return tier, prefix, manifest, tier.path_of(prefix + manifest.files[0].name)


def _counts() -> tuple[int, int]:
    return mapped_load.counters.hashed_bytes, mapped_load.counters.trusted_files


def _flip_by_replacing(path: Path) -> None:
    """Replace ``path`` with a copy whose last byte differs (a new inode, same size)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    spare = path.with_name(path.name + ".new")
    spare.write_bytes(bytes(data))
    spare.replace(path)


def test_a_file_with_a_matching_receipt_is_not_hashed_again(tmp_path: Path) -> None:
    tier, prefix, manifest, path = _saved(tmp_path)
    size = manifest.files[0].size
    hashed, trusted = _counts()
    state: Any = map_copy(tier, prefix, manifest, received={Receipt.of(path)})
    assert _counts() == (hashed, trusted + 1)
    assert torch.equal(state["w"], torch.arange(4096, dtype=torch.float32))

    # Without a receipt (a file already in the area, not received now): every byte.
    map_copy(tier, prefix, manifest)
    assert _counts() == (hashed + size, trusted + 1)


def test_a_file_replaced_after_its_receipt_is_hashed_and_its_flip_caught(
    tmp_path: Path,
) -> None:
    tier, prefix, manifest, path = _saved(tmp_path)
    receipt = Receipt.of(path)
    _flip_by_replacing(path)
    assert path.stat().st_size == receipt.size  # only the inode tells them apart
    hashed, trusted = _counts()
    with pytest.raises(ChecksumMismatchError):
        map_copy(tier, prefix, manifest, received={receipt})
    assert _counts() == (hashed + receipt.size, trusted)


def test_a_receipt_names_one_file_not_its_contents(tmp_path: Path) -> None:
    # The same bytes at another path (a receipt taken elsewhere) do not vouch for it.
    tier, prefix, manifest, path = _saved(tmp_path)
    twin = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(path, twin)
    hashed, _ = _counts()
    map_copy(tier, prefix, manifest, received={Receipt.of(twin)})
    assert _counts()[0] == hashed + manifest.files[0].size


def test_a_file_hashed_in_place_gets_a_receipt_only_when_every_byte_matches(
    tmp_path: Path,
) -> None:
    tier, prefix, manifest, path = _saved(tmp_path)
    record = manifest.files[0]
    hashed, trusted = _counts()
    receipt = hashed_receipt(path, record)
    assert receipt == Receipt.of(path)
    assert _counts() == (hashed + record.size, trusted)
    # The load that took it maps the file without hashing it again: once in all.
    state: Any = map_copy(tier, prefix, manifest, received={receipt})
    assert _counts() == (hashed + record.size, trusted + 1)
    assert torch.equal(state["w"], torch.arange(4096, dtype=torch.float32))

    _flip_by_replacing(path)
    assert hashed_receipt(path, record) is None
    assert hashed_receipt(tmp_path / "missing.safetensors", record) is None
    with pytest.raises(ChecksumMismatchError):  # the earlier receipt names the old inode
        map_copy(tier, prefix, manifest, received={receipt})


def test_a_file_replaced_while_it_is_hashed_gets_no_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, manifest, path = _saved(tmp_path)
    real = mapped_load._hashed

    def rewritten_meanwhile(mapped: Any, record: Any) -> Any:
        hasher = real(mapped, record)
        # The same bytes renamed in while the hashed inode is still mapped: a new inode.
        spare = path.with_name(path.name + ".new")
        spare.write_bytes(path.read_bytes())
        spare.replace(path)
        return hasher

    monkeypatch.setattr(mapped_load, "_hashed", rewritten_meanwhile)
    assert hashed_receipt(path, manifest.files[0]) is None
    monkeypatch.undo()
    assert hashed_receipt(path, manifest.files[0]) == Receipt.of(path)  # the bytes are fine


WORLD = 4
DOMAINS = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}


def _state(rank: int) -> dict[str, torch.Tensor]:
    # Integer-valued floats: exact, whatever the process computes them in.
    return {"w": torch.arange(8192, dtype=torch.float32) * (rank + 1)}


def _checkpointer(root: str) -> mouthguard.Checkpointer:
    peers = mouthguard.PeerMemory(
        path=Path(root) / "shm", domains=DOMAINS, keep=2, timeout=30.0, chunk_bytes=8192
    )
    store = mouthguard.Store([LocalTier(Path(root) / "disk")])
    return mouthguard.Checkpointer(
        store, run=RUN, background=False, collective_timeout=30.0, peers=peers
    )


def _save(rank: int, world_size: int, root: str) -> None:
    _checkpointer(root).save(1, _state(rank), "routine")


def _resume_twice(rank: int, world_size: int, root: str) -> list[dict[str, Any]]:
    """Load after node n1 lost its area, then load again; what each load cost."""
    from mouthguard.checkpoint.ranks import TorchRanks  # noqa: PLC0415 - in the child

    ckpt = _checkpointer(root)
    calls = [0]
    real = TorchRanks.all_gather

    def counted(self: TorchRanks, value: Any) -> Any:
        calls[0] += 1
        return real(self, value)

    TorchRanks.all_gather = counted  # type: ignore[method-assign]
    reports = []
    for _ in range(2):
        calls[0] = 0
        hashed, trusted = _counts()
        loaded = ckpt.load()
        reports.append(
            {
                "tier": loaded.tier,
                "exact": bool(torch.equal(loaded.state["w"], _state(rank)["w"])),  # type: ignore[index]
                "collectives": calls[0],
                "hashed": mapped_load.counters.hashed_bytes - hashed,
                "trusted": mapped_load.counters.trusted_files - trusted,
            }
        )
    return reports


@pytest.mark.slow
def test_a_resume_hashes_each_received_file_once_in_five_collectives(tmp_path: Path) -> None:
    run_distributed(_save, WORLD, str(tmp_path), timeout=90.0)
    # Node n1 is replaced: its area (ranks 2 and 3's files, copies of 0 and 1) is gone.
    shutil.rmtree(tmp_path / "shm" / "node-n1")
    reports = run_distributed(_resume_twice, WORLD, str(tmp_path), timeout=90.0)
    for rank, (first, second) in enumerate(reports):
        assert first["tier"] == second["tier"] == "peers"
        assert first["exact"] and second["exact"]
        received = rank in (2, 3)
        # A received file was hashed as it arrived, a kept one while the transfers
        # ran (hashed_receipt, counted with map_copy's): neither is hashed again.
        assert (first["trusted"], first["hashed"] > 0) == (1, not received)
        # The store's candidates, inventory, manifest (a node lacks it), suspect check,
        # agreement: the fetch's and the commit's gathers are gone (the manifest here
        # is under TorchRanks' inline bound, so it is one all_gather).
        assert first["collectives"] == 5, first
        # The second load finds every file at home: nothing received, all hashed, and
        # no manifest travels -- candidates, inventory, suspect check, agreement.
        assert (second["trusted"], second["hashed"] > 0) == (0, True)
        assert second["collectives"] == 4, second
    # The replaced node committed the step again once every rank had loaded it.
    assert (tmp_path / "shm" / "node-n1" / RUN / f"{1:012d}" / "manifest.json").exists()


def _save_milestone(rank: int, world_size: int, root: str) -> None:
    _checkpointer(root).save(1, _state(rank), "milestone")  # in the store and peer memory


def _resume(rank: int, world_size: int, root: str) -> dict[str, Any]:
    import warnings  # noqa: PLC0415 - in the child

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = _checkpointer(root).load()
    return {
        "tier": loaded.tier,
        "exact": bool(torch.equal(loaded.state["w"], _state(rank)["w"])),  # type: ignore[index]
        "warnings": [str(w.message) for w in caught],
    }


@pytest.mark.slow
def test_a_survivor_whose_own_file_was_damaged_gets_no_receipt(tmp_path: Path) -> None:
    run_distributed(_save_milestone, WORLD, str(tmp_path), timeout=90.0)
    shutil.rmtree(tmp_path / "shm" / "node-n1")  # files cross nodes: survivors hash meanwhile
    kept = tmp_path / "shm" / "node-n0" / RUN / f"{1:012d}" / "rank-00000.safetensors"
    with kept.open("r+b") as f:  # one bit, in place: the same inode and size
        f.seek(-1, 2)
        last = f.read(1)[0]
        f.seek(-1, 2)
        f.write(bytes([last ^ 0x01]))
    for rank, r in enumerate(run_distributed(_resume, WORLD, str(tmp_path), timeout=90.0)):
        # Rank 0's hash during the transfer found the flip: no receipt, so its load
        # hashed the file, refused it, and every rank went to the store together.
        assert r["tier"] == "local" and r["exact"], (rank, r)
        assert any("could not be loaded from peer memory" in w for w in r["warnings"]), r
