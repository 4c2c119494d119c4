"""The KV-cache benchmark end to end on a tiny trace: every row is reported (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.kvcache import cgroup
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


def test_the_conversation_trace_has_the_published_shape() -> None:
    trace = traces.conversation(4000)
    blocks = [len(r.hash_ids) for r in trace]
    assert 20 <= sum(blocks) / len(blocks) <= 35  # ~26 blocks a request
    assert all(r.hash_ids[0] == 0 for r in trace)  # one block every request shares
    assert 0.2 <= traces.ideal_lru_hit_rate(trace, 26_624) <= 0.4  # low reuse: puts dominate


def test_a_ram_confined_run_reports_both_stores(tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=False, timeout=60
    )
    cgroup.release("mouthguard-kvbench-probe")
    if probe.returncode != 0:
        pytest.skip(f"no memory cgroup can be made here: {probe.stdout.strip()}")
    out = tmp_path / "kv.md"
    args = ["--quick", "--requests", "40", "--dir", str(tmp_path), "--out", str(out)]
    assert main([*args, "--ram-budget-mib", "256"]) == 0
    report = out.read_text()
    assert "each store in its own memory cgroup" in report
    assert "| mouthguard KVStore |" in report and "| naive file per block |" in report


#: Tries to confine a throwaway process; exit 1 with the reason where it cannot.
PROBE = """
import sys
from benchmarks.kvcache import cgroup
why = cgroup.confine("mouthguard-kvbench-probe", 1 << 30)
print(why or "")
sys.exit(1 if why else 0)
"""
