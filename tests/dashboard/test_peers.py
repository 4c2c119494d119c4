"""Peer memory on the page: the node areas a real 4-rank gloo job left, as ``ls --peers``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.dashboard import Sources
from mouthguard.tiers.local import LocalTier
from tests.dashboard.helpers import Element, Served, browse, by_id, find_all, parse_dom, serving
from tests.distributed import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer-memory")]

#: Four ranks as four nodes of one: rank r's copies are in nodes r and r + 1 (mod 4).
DOMAINS = {0: "a", 1: "b", 2: "c", 3: "d"}


def _job(rank: int, world_size: int, root: str) -> None:
    """Three routine saves: peer memory only, the two newest kept on every node."""
    del world_size  # the harness's argument; the domains say it all
    peers = mouthguard.PeerMemory(path=Path(root) / "shm", domains=DOMAINS, keep=2, timeout=60)
    store = mouthguard.Store([LocalTier(Path(root) / "disk")])
    ckpt = mouthguard.Checkpointer(store, run="job", background=False, peers=peers)
    for step in (1, 2, 3):
        ckpt.save(step, {"w": torch.full((1024,), float(rank * 10 + step))})
    ckpt.close()


@pytest.fixture(scope="module")
def peer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's node areas. The tests below lose nodes from it in file order: a, then b."""
    root = tmp_path_factory.mktemp("peers")
    run_distributed(_job, 4, str(root), timeout=120.0)
    return root / "shm"


@pytest.fixture(scope="module")
def served(peer_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = mouthguard.open_store(tmp_path_factory.mktemp("store") / "store")
    with serving(store, sources=Sources(peers=str(peer_path))) as served:
        yield served


def _by_node(body: dict[str, Any], step: int) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in body["rows"] if (r["run"], r["step"]) == ("job", step)}


def test_the_api_lists_each_node_and_judges_each_step(served: Served, peer_path: Path) -> None:
    assert served.json("/api/summary")["peers"] == str(peer_path)
    body = served.json("/api/peers")
    assert (body["nodes"], body["steps"], body["total"]) == (4, 2, 8)  # steps 2, 3 on 4 nodes
    held = _by_node(body, 3)
    # Each node holds its own rank's file and the copy of the rank before it on the ring.
    assert {n: r["ranks"] for n, r in held.items()} == {
        "a": [0, 3],
        "b": [0, 1],
        "c": [1, 2],
        "d": [2, 3],
    }
    assert all(r["complete"] and r["recoverable"] and r["world_size"] == 4 for r in held.values())
    assert body["bytes"] == sum(r["bytes"] for r in body["rows"])
    # Node a is lost: every rank still has a copy somewhere.
    shutil.rmtree(peer_path / "node-a")
    held = _by_node(served.json("/api/peers"), 3)
    assert set(held) == {"b", "c", "d"} and all(r["recoverable"] for r in held.values())


def test_the_page_shows_what_is_lost_and_what_is_in_flight(
    served: Served, peer_path: Path, tmp_path: Path
) -> None:
    shutil.rmtree(peer_path / "node-a", ignore_errors=True)
    shutil.rmtree(peer_path / "node-b")  # rank 0's both holders: step 3 cannot be resumed
    # What a save killed in the middle leaves: a rank file, no manifest.
    partial = peer_path / "node-c" / "job" / f"{4:012d}"
    partial.mkdir()
    shutil.copy(peer_path / "node-c" / "job" / f"{3:012d}" / "rank-00002.safetensors", partial)
    body = served.json("/api/peers")
    step3 = _by_node(body, 3)
    assert all(r["missing"] == [0] and not r["recoverable"] for r in step3.values())
    (in_flight,) = _by_node(body, 4).values()
    assert not in_flight["complete"] and in_flight["ranks"] == [2]
    dom = parse_dom(browse(served.url + "/", tmp_path / "profile", "--dump-dom").stdout)
    (loaded,) = find_all(dom, "body")
    assert loaded.attrs["data-loaded"] == "true"
    assert "hidden" not in by_id(dom, "peers-section").attrs
    summary = by_id(dom, "peers-summary").text
    assert summary.startswith(str(peer_path)) and "2 node area(s), 2 complete step(s)" in summary
    rows = find_all(by_id(dom, "peers"), "tr", data_run="job")
    shown = {(r.attrs["data-node"], r.attrs["data-step"]): _cells(r) for r in rows}
    assert set(shown) == {("c", "4"), ("c", "3"), ("d", "3"), ("c", "2"), ("d", "2")}
    assert shown[("c", "3")][3] == "1,2"
    assert shown[("c", "3")][5] == "complete here; rank(s) 0 on no node"
    assert shown[("c", "4")][5] == "save in flight or interrupted (no manifest)"


def test_the_section_stays_hidden_without_peer_memory(tmp_path: Path) -> None:
    store = mouthguard.open_store(tmp_path / "store")
    with serving(store) as served:
        assert served.json("/api/summary")["peers"] is None
        assert served.get("/api/peers")[0] == 404
        dom = parse_dom(browse(served.url + "/", tmp_path / "profile", "--dump-dom").stdout)
    assert "hidden" in by_id(dom, "peers-section").attrs


def _cells(row: Element) -> list[str]:
    return [cell.text.strip() for cell in find_all(row, "td")]
