"""The KV-cache benchmark end to end on a tiny trace: every row is reported (no timings)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.kvcache import trace as traces
from benchmarks.kvcache.__main__ import main


def test_the_benchmark_reports_every_store(tmp_path: Path) -> None:
    out = tmp_path / "kv.md"
    assert main(["--quick", "--requests", "60", "--dir", str(tmp_path), "--out", str(out)]) == 0
    report = out.read_text()
    for row in ("| mouthguard KVStore |", "| naive file per block |", "| LMCache local disk |"):
        assert row in report
    assert "| memory |" in report
    assert "| disk |" in report
    assert "load average at start" in report


def test_mooncake_format_round_trips(tmp_path: Path) -> None:
    trace = traces.synthetic(50, seed=3)
    path = tmp_path / "t.jsonl"
    traces.write(path, trace)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"timestamp", "input_length", "output_length", "hash_ids"}
    assert traces.read(path) == trace
    assert all(len(r.hash_ids) * traces.MOONCAKE_BLOCK_TOKENS >= r.input_length for r in trace)


def test_ideal_lru_counts_prefix_hits() -> None:
    a = traces.Request(0, 1024, 1, [1, 2])
    b = traces.Request(1, 1536, 1, [1, 2, 3])
    assert traces.ideal_lru_hit_rate([a, b], capacity_blocks=10) == 2 / 5
    assert traces.ideal_lru_hit_rate([a, b], capacity_blocks=0) == 0.0
