"""A Mooncake-format trace replayed inside vLLM: prefix hit rate, requests/s, TTFT.

    python -m benchmarks.vllm.replay                  # writes docs/benchmarks-vllm-replay.md
    python -m benchmarks.vllm.replay --quick --out /tmp/replay.md
    python -m benchmarks.vllm.replay --trace real.jsonl   # a trace of 128-token hash ids

Writes a bounded synthetic trace in Mooncake's format (``benchmarks.kvcache.trace``'s
multi-round chat generator, with hash ids of the engine's 128-token blocks and
sessions capped in length so a prompt fits the model), then replays it once per
configuration, each in its own engine (``benchmarks/vllm/replay_engine.py`` with
the vLLM environment's interpreter), in the same run. What is counted is at the
top of the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.kvcache import trace as traces
from benchmarks.vllm.engine_run import (
    CONFIGS,
    GPU_CONFIGS,
    LABELS,
    NOT_RUNNABLE,
    ROOT,
    run_engine_script,
)
from benchmarks.vllm.trace_prompts import BLOCK_TOKENS, reusable_tokens

ENGINE = Path(__file__).with_name("replay_engine.py")


def make_trace(requests: int, seed: int, max_blocks: int) -> list[traces.Request]:
    """The replay's synthetic trace: a few chat sessions over a few system prompts.

    No prompt is one token longer than a whole number of blocks: vLLM's
    ExampleConnector looks such a prompt up under a key one block shorter than
    the one it loads (``align_to_block_size(len - 1)`` against ``(len)``), finds a
    shorter prompt's entry and dies on the missing file (``No such file or
    directory: .../model.layers.0.self_attn.attn.safetensors``). Such lengths get
    one more token, the same trace for every configuration.
    """
    trace = traces.synthetic(
        requests,
        seed=seed,
        sessions=6,
        system_prompts=3,
        block_tokens=BLOCK_TOKENS,
        max_blocks=max_blocks,
    )
    return [
        dataclasses.replace(r, input_length=r.input_length + 1)
        if r.input_length % BLOCK_TOKENS == 1
        else r
        for r in trace
    ]


def run_config(python: Path, config: str, trace: Path, work: Path, args: Any) -> dict[str, Any]:
    """One configuration's replay (a fresh engine); its JSON result."""
    options = ["--config", config, "--trace", str(trace), "--work", str(work)]
    options += ["--max-output", str(args.max_output)]
    options += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    result = work / f"{config}-result.json"
    options += ["--result", str(result)]
    return run_engine_script(python, ENGINE, options, config, result)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) by linear interpolation (statistics' inclusive method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Hit rate, requests/s and TTFT percentiles of one configuration's replay."""
    rows = result["requests"]
    prompt = sum(r["prompt_tokens"] for r in rows)
    ttft = [r["ttft_s"] for r in rows]
    loaded = [r["loaded_tokens"] for r in rows if r["loaded_tokens"] is not None]
    failed = [r["failed_tokens"] for r in rows if r["failed_tokens"] is not None]
    return {
        "hit_rate": sum(r["cached_tokens"] for r in rows) / prompt,
        "requests_per_s": len(rows) / result["seconds"],
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p90_s": percentile(ttft, 0.9),
        "loaded_tokens": sum(loaded) if loaded else None,
        "failed_tokens": sum(failed) if failed else None,
        "seconds": result["seconds"],
    }


def _rows(results: dict[str, dict[str, Any]], reference: list[Any]) -> list[str]:
    """One table row per configuration, its rate also as a ratio to recompute's."""
    rows = []
    summaries = {config: summarize(result) for config, result in results.items()}
    base = summaries["recompute"]
    for config, result in results.items():
        s = summaries[config]
        same = [r["tokens"] for r in result["requests"]] == reference
        loaded = "-" if s["loaded_tokens"] is None else str(s["loaded_tokens"])
        failed = "-" if s["failed_tokens"] is None else str(s["failed_tokens"])
        rows.append(
            f"| {LABELS[config]} | {s['hit_rate']:.2f} | {s['requests_per_s']:.2f} | "
            f"{s['requests_per_s'] / base['requests_per_s']:.2f} | "
            f"{s['ttft_p50_s'] * 1e3:.0f} | {s['ttft_p90_s'] * 1e3:.0f} | {loaded} | "
            f"{failed} | {'yes' if same else 'NO'} |"
        )
    return rows


def report(
    trace: list[traces.Request],
    results: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    seconds: float,
) -> str:
    """The Markdown report."""
    reference = [r["tokens"] for r in results["recompute"]["requests"]]
    prompt = sum(r.input_length for r in trace)
    ceiling = sum(reusable_tokens(trace, BLOCK_TOKENS)) / prompt
    rows = _rows(results, reference)
    identical = all(
        [r["tokens"] for r in result["requests"]] == reference for result in results.values()
    )
    lengths = [r.input_length for r in trace]
    source = (
        f"the file `{args.trace.name}`"
        if args.trace
        else "synthetic: multi-round chat, 6 sessions over 3 system prompts, seed "
        f"{args.seed}; no prompt is a whole number of blocks plus one token, a length "
        "on which vLLM's ExampleConnector looks up one key and loads another, and dies"
    )
    lines = [
        "# vLLM: Mooncake-format trace replay inside the engine",
        "",
        f"Command: `python -m benchmarks.vllm.replay {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (a shared machine: figures are "
        f"comparable within this run only). Whole run {seconds:.0f} s.",
        "",
        f"Trace: {len(trace)} requests in Mooncake's format ({source}), hash ids of "
        f"{BLOCK_TOKENS}-token blocks (vLLM's block size on a CPU), prompts "
        f"of {min(lengths)}-{max(lengths)} tokens ({prompt} in all). Each hash id is the "
        "same pseudo-random tokens wherever it appears, so shared ids are shared "
        f"prefixes. The model: a random-weight Llama (hidden {args.hidden}, {args.layers} "
        f"layers, fp32, {2 * args.layers * args.hidden * 4 // 1024} KiB of KV per token). "
        "Requests are sent one at a time in trace order (closed loop; the timestamps "
        f"only order them), greedy, with `max_tokens = min(output_length, {args.max_output})`; "
        "before each one `LLM.reset_prefix_cache()` empties the engine's own prefix "
        "cache, so every prefix not recomputed came from the connector. Each "
        "configuration is one fresh engine, replaying the trace once.",
        "",
        "* **hit rate**: prompt tokens the engine did not compute (its "
        "`num_cached_tokens`, here all loaded by the connector) / prompt tokens. "
        f"The ceiling for this trace is {ceiling:.2f}: the whole {BLOCK_TOKENS}-token "
        "blocks of each prompt's longest prefix seen before, short of its last token "
        "(which the engine always computes).",
        "* **requests/s**: requests / the wall time of the replay loop (prefill, "
        "the few output tokens, the cache resets; engine start excluded).",
        "* **TTFT**: vLLM's own `first_token_latency` of each request (from its arrival "
        "in the engine to its first token: scheduling, the connector's load and the "
        "prefill), p50 and p90 over the requests.",
        "* **loaded / failed**: the tokens MouthguardConnector reports loaded, and "
        "failed (recomputed), summed (`kv_transfer_params`; ExampleConnector reports none).",
        "",
        "| configuration | hit rate | requests/s | x recompute | TTFT p50 ms | TTFT p90 ms "
        "| loaded | failed | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Tokens identical in every configuration (every request's output against "
        f"recompute's): {'yes' if identical else 'NO'}.",
        "",
        "Not runnable on this machine (`--configs` adds them where they run):",
        "",
        *[f"* {name}: {why}." for name, why in NOT_RUNNABLE],
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-blocks", type=int, default=12)
    parser.add_argument("--max-output", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--trace", type=Path, help="replay this Mooncake-format file instead")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated; on a GPU machine add {', '.join(GPU_CONFIGS)}",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-vllm-replay.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_blocks, args.hidden, args.layers = 8, 4, 128, 2
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS) - set(GPU_CONFIGS))
    if unknown or "recompute" not in configs:
        parser.error(f"--configs: unknown {unknown}; recompute is the reference, keep it")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mg-vllm-replay-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        trace = (
            traces.read(args.trace)
            if args.trace
            else make_trace(args.requests, args.seed, args.max_blocks)
        )
        traces.write(path, trace)
        results = {}
        for config in configs:
            work = Path(tmp) / "work"
            work.mkdir(exist_ok=True)
            results[config] = run_config(args.python, config, path, work, args)
            s = summarize(results[config])
            print(
                f"{config}: hit {s['hit_rate']:.2f}, {s['requests_per_s']:.2f} req/s, "
                f"TTFT p50 {s['ttft_p50_s'] * 1e3:.0f} ms",
                file=sys.stderr,
            )
    text = report(trace, results, args, time.perf_counter() - started)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
