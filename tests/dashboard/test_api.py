"""The dashboard over real HTTP on loopback: /api JSON, /metrics, and the mutation token."""

from __future__ import annotations

import datetime as dt
import json
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from typing_extensions import override

import mouthguard
from mouthguard.checkpoint import ranks
from mouthguard.dashboard import Sources
from mouthguard.errors import TierError
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier
from mouthguard.tiers.wrapper import WrappedTier
from tests.dashboard.helpers import TOKEN, Served, ops_store, serving

LATER = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


def test_summary(served: Served) -> None:
    body = served.json("/api/summary")
    assert body["checkpoints"] == 8 and body["mutations"] is False
    assert body["by_state"]["protected"] >= 2 and body["by_state"]["committed"] >= 1
    assert [t["name"] for t in body["tiers"]] == ["fast", "durable"]
    for tier in body["tiers"]:  # local tiers: they answer, and their disk has room
        assert tier["health"] == "ok"
        assert 0 < tier["free_bytes"] <= tier["total_bytes"]
    assert {r["run"] for r in body["runs"]} == {"alpha", "beta"}
    assert body["pending"]["trash"] >= 2


def test_checkpoints_page_filters_and_order(served: Served) -> None:
    everything = served.json("/api/checkpoints?limit=500")
    assert everything["total"] == 8 and len(everything["rows"]) == 8
    newest_first = [(r["run"], r["step"]) for r in everything["rows"]]
    assert newest_first == sorted(newest_first, reverse=True)
    page = served.json("/api/checkpoints?order=asc&offset=2&limit=3")
    assert [(r["run"], r["step"]) for r in page["rows"]] == [
        ("alpha", 30),
        ("beta", 1),
        ("beta", 2),
    ]
    assert page["total"] == 8 and page["offset"] == 2
    held = served.json("/api/checkpoints?held=true")
    assert [(r["run"], r["step"]) for r in held["rows"]] == [("alpha", 20)]
    milestone = served.json("/api/checkpoints?importance=milestone&run=alpha")
    assert [r["step"] for r in milestone["rows"]] == [20]
    committed = served.json("/api/checkpoints?state=committed")
    assert ("alpha", 30) in [(r["run"], r["step"]) for r in committed["rows"]]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit must be >= 1 and <= 500"),
        ("limit=501", "limit must be >= 1 and <= 500"),
        ("offset=-1", "offset must be >= 0"),
        ("offset=ten", "offset must be an integer"),
        ("state=fine", "state must be one of"),
        ("importance=gold", "importance must be one of"),
        ("order=random", "order must be one of"),
        ("held=maybe", "held must be one of"),
    ],
)
def test_bad_parameters_are_400_with_a_reason(served: Served, query: str, message: str) -> None:
    status, body = served.get("/api/checkpoints?" + query)
    assert status == 400 and message in json.loads(body)["error"]


def test_one_checkpoint_and_404(served: Served) -> None:
    row = served.json("/api/checkpoints/alpha/20")
    assert row["holds"] == ["release-candidate"] and row["importance"] == "milestone"
    status, body = served.get("/api/checkpoints/alpha/99")
    assert status == 404 and json.loads(body) == {"error": "no checkpoint alpha step 99"}


def test_timeline(served: Served) -> None:
    alpha = served.json("/api/timeline?run=alpha")
    assert [s["step"] for s in alpha["saves"]] == [10, 20, 30]
    assert [s["mode"] for s in alpha["saves"]] == ["sync", "async", "sync"]
    assert all(s["seconds"] >= s["stall_seconds"] > 0 for s in alpha["saves"])
    assert served.json("/api/timeline?run=alpha&limit=2")["saves"][0]["step"] == 20
    assert served.json("/api/timeline?run=nobody") == {"run": "nobody", "total": 0, "saves": []}
    # No run named: the one with the most saves (beta, 5), not that of the newest (alpha 30).
    assert served.json("/api/timeline")["run"] == "beta"


def test_pending(served: Served) -> None:
    one = served.json("/api/pending?limit=1")
    assert len(one["actions"]) == 1 and one["total_actions"] >= 2
    assert len(one["checkpoints"]) == 1 and one["total_checkpoints"] >= 2
    body = served.json("/api/pending")
    assert len(body["actions"]) == body["total_actions"]
    trashed = {(a["run"], a["step"]) for a in body["actions"] if a["action"] == "trash"}
    assert {("beta", 1), ("beta", 2)} <= trashed
    reasons = [c for c in body["checkpoints"] if (c["run"], c["step"]) == ("beta", 1)]
    assert reasons and "older than the last 3 valid routine" in " ".join(reasons[0]["reasons"])
    suspect = [c for c in body["checkpoints"] if (c["run"], c["step"]) == ("alpha", 30)]
    assert suspect and suspect[0]["reasons"][0].startswith("suspect: the loss is NaN")


def test_a_suspect_row_names_the_word_and_its_reason(served: Served) -> None:
    row = served.json("/api/checkpoints/alpha/30")
    assert row["suspect"] == "the loss is NaN"
    assert "suspect: the loss is NaN (a resume skips it)" in row["protection_missing"]
    assert row["retention"]["reasons"][0].startswith("suspect: the loss is NaN")
    assert served.json("/api/checkpoints/alpha/10")["suspect"] is None


def test_another_host_name_is_refused(served: Served) -> None:
    status, _ = served.get("/api/summary", headers={"Host": "attacker.example"})
    assert status == 400
    assert served.get("/api/summary", headers={"Host": "localhost"})[0] == 200


def test_page_and_assets_come_from_the_package(served: Served) -> None:
    status, page = served.get("/")
    assert status == 200 and b'<script src="/static/app.js">' in page
    assert b"http" not in page.replace(b"http://www.w3.org", b"")  # no CDN
    for asset in ("app.js", "style.css"):
        assert served.get(f"/static/{asset}")[0] == 200
    assert served.get("/static/../app.py")[0] == 404


# --- /metrics -----------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_parse_as_prometheus_text(ops: mouthguard.Store) -> None:
    with serving(ops, now=LATER) as served:
        status, raw = served.get("/metrics")
    assert status == 200
    text = raw.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("mouthguard_") for name in families)
    samples = _samples(text)
    count = lambda state, level: samples[  # noqa: E731
        ("mouthguard_checkpoints", (("importance", level), ("state", state)))
    ]
    assert count("protected", "milestone") == 1  # alpha 20
    assert count("committed", "routine") >= 1  # alpha 30
    assert sum(v for (name, _), v in samples.items() if name == "mouthguard_checkpoints") == 8
    assert samples[("mouthguard_damaged_copies", (("tier", "fast"),))] == 1  # beta 5
    assert samples[("mouthguard_damaged_copies", (("tier", "durable"),))] == 0
    # The old name, still exported for one release with the same samples.
    for tier in ("fast", "durable"):
        assert (
            samples[("mouthguard_verification_failures", (("tier", tier),))]
            == samples[("mouthguard_damaged_copies", (("tier", tier),))]
        )
    unprotected = samples[("mouthguard_unprotected_bytes", (("importance", "routine"),))]
    assert unprotected > 0
    assert samples[("mouthguard_held_checkpoints", ())] == 1
    # alpha 30 has been unprotected since it was saved; in 2100 that is decades.
    lag = samples[("mouthguard_replication_lag_seconds", (("run", "alpha"),))]
    assert lag > 60 * 365 * 86400
    stall = samples[("mouthguard_last_save_stall_seconds", (("run", "alpha"),))]
    took = samples[("mouthguard_last_save_seconds", (("run", "alpha"),))]
    assert 0 < stall <= took
    assert samples[("mouthguard_pending_actions", (("action", "trash"),))] >= 2


def test_metrics_of_a_fully_protected_run_show_no_lag(tmp_path: Path) -> None:
    from mouthguard.jobs.replicator import Replicator  # noqa: PLC0415

    store = mouthguard.open_store(tmp_path / "store")
    mouthguard.Checkpointer(store, "r", background=False).save(1, {"w": torch.ones(4)})
    Replicator(store).run_once()
    with serving(store, now=LATER) as served:
        samples = _samples(served.get("/metrics")[1].decode())
    assert samples[("mouthguard_replication_lag_seconds", (("run", "r"),))] == 0
    assert samples[("mouthguard_unprotected_bytes", (("importance", "routine"),))] == 0


# --- mutations ------------------------------------------------------------------------


def _post(
    served: Served, path: str, body: object, token: str | None
) -> tuple[int, dict[str, object]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    status, raw = served.request("POST", path, json.dumps(body).encode(), headers)
    return status, json.loads(raw)


def _holds(ops: mouthguard.Store, run: str, step: int) -> tuple[str, ...]:
    info = mouthguard.Checkpointer(ops, run, background=False).info(step)
    assert info is not None
    return info.holds


def test_read_only_by_default(served: Served, ops: mouthguard.Store) -> None:
    status, body = _post(served, "/api/checkpoints/alpha/30/hold", {"name": "x"}, TOKEN)
    assert status == 403 and "read-only" in str(body["error"])
    assert _holds(ops, "alpha", 30) == ()


@pytest.mark.parametrize("token", [None, "", "wrong-token-of-some-length", TOKEN + "x"])
def test_a_mutation_without_the_token_is_refused(tmp_path: Path, token: str | None) -> None:
    store = ops_store(tmp_path / "store") if token is None else _small(tmp_path)
    run, step = ("alpha", 30) if token is None else ("r", 1)
    with serving(store, token=TOKEN) as served:
        for verb, body in [("hold", {"name": "x"}), ("importance", {"level": "critical"})]:
            status, reply = _post(served, f"/api/checkpoints/{run}/{step}/{verb}", body, token)
            assert status == 401 and "Bearer" in str(reply["error"])
    info = mouthguard.Checkpointer(store, run, background=False).info(step)
    assert info is not None and info.holds == () and info.importance.value == "routine"


def test_mutations_with_the_token(tmp_path: Path) -> None:
    store = _small(tmp_path)
    with serving(store, token=TOKEN) as served:
        status, body = _post(served, "/api/checkpoints/r/1/hold", {"name": "audit"}, TOKEN)
        assert status == 200 and body["holds"] == ["audit"]
        assert _holds(store, "r", 1) == ("audit",)
        assert served.json("/api/checkpoints/r/1")["held"] is True  # the page sees it at once
        status, body = _post(served, "/api/checkpoints/r/1/importance", {"level": "golden"}, TOKEN)
        assert status == 200 and body["importance"] == "critical"
        status, body = _post(served, "/api/checkpoints/r/1/release", {"name": "audit"}, TOKEN)
        assert status == 200 and body["done"] is True and body["holds"] == []
        status, body = _post(served, "/api/checkpoints/r/1/release", {"name": "audit"}, TOKEN)
        assert status == 200 and body["done"] is False  # no such hold any more
        # Bad input: a clear error, nothing changed.
        for path, payload, code in [
            ("/api/checkpoints/r/1/importance", {"level": "gold"}, 400),
            ("/api/checkpoints/r/1/hold", {"name": "../escape"}, 400),
            ("/api/checkpoints/r/1/hold", ["not", "an", "object"], 400),
            ("/api/checkpoints/r/9/hold", {"name": "x"}, 404),
            ("/api/checkpoints/r/1/delete", {}, 404),
            ("/api/checkpoints/r/1/hold", {"name": "x" * 5000}, 413),
        ]:
            status, reply = _post(served, path, payload, TOKEN)
            assert status == code and reply["error"], (path, payload)
    info = mouthguard.Checkpointer(store, "r", background=False).info(1)
    assert info is not None and info.holds == () and info.importance.value == "critical"


def test_a_mutation_in_a_distributed_process_reaches_no_collective(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded in rank 0 of a job, a request thread must never join a checkpoint collective."""
    import torch.distributed as dist  # noqa: PLC0415 - the test pretends a job is running

    store = _small(tmp_path)

    def no_collective(*_args: object, **_kw: object) -> None:
        raise AssertionError("a dashboard request built a process group")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda _group=None: 2)
    monkeypatch.setattr(ranks, "TorchRanks", no_collective)
    with serving(store, token=TOKEN) as served:
        status, body = _post(served, "/api/checkpoints/r/1/hold", {"name": "audit"}, TOKEN)
    assert status == 200 and body["holds"] == ["audit"]


def _small(tmp_path: Path) -> mouthguard.Store:
    store = mouthguard.open_store(tmp_path / "small")
    mouthguard.Checkpointer(store, "r", background=False).save(1, {"w": torch.ones(4)})
    return store


# --- datasets and KV caches -----------------------------------------------------------


def test_datasets_and_kv_caches(tmp_path: Path) -> None:
    from mouthguard.data import ShardWriter  # noqa: PLC0415

    with ShardWriter(tmp_path / "data", "ds", shard_size=10240) as writer:
        for i in range(20):
            writer.write({"__key__": f"s{i:03d}", "txt": f"sample {i}".encode() * 200})
    missing = str(tmp_path / "nothing-here")
    stats = {"memory": {"blocks": 3, "bytes": 300, "hits": 5, "misses": 1, "evictions": 0}}
    sources = Sources(
        datasets=(str(tmp_path / "data" / "ds"), missing), kvcache={"llama": lambda: stats}
    )
    with serving(_small(tmp_path), sources=sources) as served:
        summary = served.json("/api/summary")
        assert summary["datasets"] == 2 and summary["kvcaches"] == 1
        good, bad = served.json("/api/datasets")
        assert good["name"] == "ds" and good["samples"] == 20 and good["kind"] == "webdataset"
        assert good["units"] >= 2 and good["fingerprint"].startswith("sha256:")
        assert bad["location"] == missing and bad["error"]
        (kv,) = served.json("/api/kvcache")
        assert kv == {"cache": "llama", "tier": "memory", **stats["memory"]}


def _raw_post(served: Served, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """Send a POST's headers and only ``body`` (maybe less than announced); the reply.

    The connection stays open after ``body``: a server that waited for the rest
    would never answer (the socket timeout then fails the test).
    """
    address = urllib.parse.urlsplit(served.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as conn:
        head = [f"POST {path} HTTP/1.1", f"Host: {address.hostname}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply


def _status(reply: bytes) -> int:
    """The status code of a raw HTTP reply (``HTTP/1.1 413 Request Entity Too Large``)."""
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_huge_body_is_never_read(tmp_path: Path, token: str | None) -> None:
    """Announced as 1 GiB, only 1 KiB sent: refused at once, before the token check
    (401) or by its announced length (413), without waiting for the rest."""
    with serving(_small(tmp_path), token=TOKEN) as served:
        headers = {"Content-Type": "application/json", "Content-Length": str(1 << 30)}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        reply = _raw_post(served, "/api/checkpoints/r/1/hold", headers, b"{" + b" " * 1023)
    assert _status(reply) == (401 if token is None else 413), reply[:200]


def test_a_chunked_body_is_cut_off_past_the_cap(tmp_path: Path) -> None:
    """No length announced: reading stops past 4 KiB, while the client is still sending."""
    with serving(_small(tmp_path), token=TOKEN) as served:
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "Transfer-Encoding": "chunked",
        }
        chunk = b" " * 5000
        body = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # never terminated
        reply = _raw_post(served, "/api/checkpoints/r/1/hold", headers, body)
    assert _status(reply) == 413, reply[:200]
    assert _holds(served.store, "r", 1) == ()


class _DeadTier(WrappedTier):
    """A tier whose every operation fails, as an object store that is down."""

    @override
    def exists(self, key: str) -> bool:
        raise TierError("connection refused")

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        raise TierError("connection refused")

    @override
    def list_dirs(self, prefix: str = "") -> list[str]:
        raise TierError("connection refused")


def test_a_tier_that_does_not_answer_is_shown_unreachable(tmp_path: Path) -> None:
    fast = LocalTier(tmp_path / "fast", "fast", "node-a")
    dead = _DeadTier(MemoryTier("objects", "region-b"))
    with serving(mouthguard.Store([fast, dead])) as served:
        tiers = {t["name"]: t for t in served.json("/api/summary")["tiers"]}
    assert tiers["fast"]["health"] == "ok"
    assert tiers["objects"]["health"] == "unreachable: connection refused"
    assert tiers["objects"]["free_bytes"] is None  # not a filesystem
