"""The vLLM trace replay's trace -> prompts logic and its report (no engine here).

The replay itself runs in ``python -m benchmarks.vllm.replay``; what it counts rests
on these: shared hash ids must give shared prompt prefixes token for token, and
the hit-rate ceiling must count only whole blocks seen before.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from benchmarks.kvcache import trace as traces
from benchmarks.vllm import replay
from benchmarks.vllm.trace_prompts import prompt_of, prompts_of, reusable_tokens

BT = 128
VOCAB = 32000


def test_shared_hash_ids_are_shared_prefixes_and_others_differ() -> None:
    a = traces.Request(0, 2 * BT + 5, 4, [1, 2, 3])
    b = traces.Request(1, 3 * BT, 4, [1, 2, 9])
    c = traces.Request(2, BT, 4, [7])
    pa, pb, pc = prompts_of([a, b, c], BT, VOCAB)
    assert (len(pa), len(pb), len(pc)) == (2 * BT + 5, 3 * BT, BT)
    assert pa[: 2 * BT] == pb[: 2 * BT]  # ids 1 and 2: the same two blocks
    assert pa[2 * BT : 2 * BT + 5] != pb[2 * BT : 2 * BT + 5]  # id 3 against id 9
    assert pc != pa[:BT]
    assert all(1 <= t < VOCAB for t in pa + pb + pc)
    assert prompt_of(a, BT, VOCAB) == pa  # the same for the same request, every time


@pytest.mark.parametrize("length", [BT, 3 * BT + 1, 0])
def test_an_input_length_outside_its_last_block_is_refused(length: int) -> None:
    request = traces.Request(5, length, 1, [1, 2, 3])
    with pytest.raises(ValueError, match="input_length"):
        prompt_of(request, BT, VOCAB)


def test_the_ceiling_counts_whole_blocks_seen_before_short_of_the_last_token() -> None:
    first = traces.Request(0, 2 * BT + 10, 1, [1, 2, 3])  # stores blocks 1, 2 (3 is partial)
    again = traces.Request(1, 2 * BT + 10, 1, [1, 2, 3])  # 3 was never whole: 2 blocks
    longer = traces.Request(2, 4 * BT, 1, [1, 2, 4, 5])  # shares 1, 2
    exact = traces.Request(3, 2 * BT, 1, [1, 2])  # both stored, but the last token is computed
    assert reusable_tokens([first, again, longer, exact], BT) == [0, 2 * BT, 2 * BT, BT]


def test_the_synthetic_trace_is_bounded_and_avoids_the_peers_fatal_lengths() -> None:
    trace = replay.make_trace(200, seed=1, max_blocks=12)
    assert len(trace) == 200
    for request in trace:
        assert len(request.hash_ids) <= 12 + 4
        assert request.input_length % BT != 1
        prompt_of(request, BT, VOCAB)  # every request is a valid prompt
    assert sum(reusable_tokens(trace, BT)) > 0  # sessions come back: there is reuse


def _result(config: str, tokens: list[list[int]], cached: list[int]) -> dict[str, object]:
    rows = [
        {
            "prompt_tokens": 300,
            "ttft_s": 0.1 * (i + 1),
            "cached_tokens": c,
            "loaded_tokens": c if config.startswith("mouthguard") else None,
            "failed_tokens": 0 if config.startswith("mouthguard") else None,
            "tokens": t,
        }
        for i, (t, c) in enumerate(zip(tokens, cached, strict=True))
    ]
    return {"config": config, "seconds": 2.0, "requests": rows}


def test_the_report_counts_hits_and_flags_different_tokens() -> None:
    trace = [traces.Request(0, 300, 4, [1, 2, 3]), traces.Request(1, 300, 4, [1, 2, 3])]
    results = {
        "recompute": _result("recompute", [[1], [2]], [0, 0]),
        "mouthguard-ram": _result("mouthguard-ram", [[1], [2]], [0, 256]),
        "example": _result("example", [[1], [3]], [0, 256]),
    }
    summary = replay.summarize(results["mouthguard-ram"])
    assert summary["hit_rate"] == 256 / 600
    assert summary["requests_per_s"] == 1.0
    assert summary["loaded_tokens"] == 256
    args = argparse.Namespace(trace=None, seed=0, hidden=128, layers=2, max_output=4)
    text = replay.report(trace, results, args, 1.0)
    assert "| MouthguardConnector, blocks in RAM | 0.43 |" in text
    assert "| vLLM ExampleConnector (safetensors file per layer, disk) | 0.43 |" in text
    assert text.count("| yes |") == 2 and "| NO |" in text
    assert "Tokens identical in every configuration" in text and ": NO." in text
    assert "ceiling for this trace is 0.43" in text


def test_a_mooncake_file_replays_as_written(tmp_path: Path) -> None:
    trace = replay.make_trace(20, seed=2, max_blocks=6)
    path = tmp_path / "t.jsonl"
    traces.write(path, trace)
    assert prompts_of(traces.read(path), BT, VOCAB) == prompts_of(trace, BT, VOCAB)
