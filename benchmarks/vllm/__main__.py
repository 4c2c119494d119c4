"""vLLM with a KV connector on this machine: time to first token of a repeated prompt.

    python -m benchmarks.vllm                       # writes docs/benchmarks-vllm.md
    python -m benchmarks.vllm --quick --out /tmp/vllm.md
    python -m benchmarks.vllm --python /path/to/vllm-venv/bin/python

Each configuration runs in its own engine (``benchmarks/vllm/ttft.py`` with the
vLLM environment's interpreter, ``.venv-vllm`` by default: ``make vllm``), in the
same run, on the same model and prompt. What is compared, and the targets, are at
the top of the report.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.vllm.engine_run import (
    CONFIGS,
    GPU_CONFIGS,
    LABELS,
    NOT_RUNNABLE,
    ROOT,
    run_engine_script,
)


def run_config(python: Path, config: str, work: Path, args: argparse.Namespace) -> dict:
    options = ["--config", config, "--work", str(work)]
    options += ["--prompt-tokens", str(args.prompt_tokens), "--repeats", str(args.repeats)]
    options += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    return run_engine_script(python, ROOT / "benchmarks" / "vllm" / "ttft.py", options, config)


def report(results: list[dict], args: argparse.Namespace, seconds: float) -> str:
    by = {r["config"]: r for r in results}
    base = by["recompute"]["ttft_median_s"]
    reference = by["recompute"]["tokens"]
    rows = []
    for r in results:
        t = r["ttft_s"]
        rows.append(
            f"| {LABELS[r['config']]} | {r['ttft_median_s'] * 1e3:.0f} "
            f"({min(t) * 1e3:.0f}-{max(t) * 1e3:.0f}) | {r['ttft_median_s'] / base:.2f} | "
            f"{r['engine_cache_hit_s'] * 1e3:.0f} | "
            f"{'-' if r['loaded_tokens'] is None else r['loaded_tokens']} | "
            f"{'yes' if r['tokens'] == reference and r.get('tokens_match', True) else 'NO'} |"
        )
    mine = {c: r["ttft_median_s"] for c, r in by.items() if c.startswith("mouthguard")}
    best = min(mine, key=mine.__getitem__)
    disk = min((c for c in mine if "disk" in c), key=mine.__getitem__, default=best)
    worst = max(mine.values())
    peers = {c: by[c]["ttft_median_s"] for c in ("example", *GPU_CONFIGS) if c in by}
    best_peer = min(peers, key=peers.__getitem__)
    peer = peers[best_peer]
    identical = all(r["tokens"] == reference and r.get("tokens_match", True) for r in results)
    verdicts = [
        f"| tokens identical in every configuration | {'met' if identical else 'NOT met'} |",
        f"| TTFT of a prefix hit <= 0.5x recompute, in every mouthguard configuration "
        f"({min(mine.values()) / base:.2f}x-{worst / base:.2f}x) | "
        f"{'met' if worst <= 0.5 * base else 'NOT met'} |",
        f"| TTFT of a prefix hit <= the best peer measured here ({LABELS[best_peer]}: "
        f"{peer * 1e3:.0f} ms; mouthguard's best: {LABELS[best]}, {mine[best] * 1e3:.0f} ms; "
        f"its best from disk: {LABELS[disk]}, {mine[disk] * 1e3:.0f} ms) | "
        f"{'met' if mine[disk] <= peer else 'NOT met (disk)'}"
        f"{'' if mine[disk] <= peer else ', met (RAM)' if mine[best] <= peer else ''} |",
    ]
    lines = [
        "# vLLM: KV connector benchmark",
        "",
        f"Command: `python -m benchmarks.vllm {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (a shared machine: times are "
        f"comparable within this run only). Whole run {seconds:.0f} s.",
        "",
        f"A random-weight Llama (hidden {args.hidden}, {args.layers} layers, "
        f"{args.hidden // 64} KV heads of 64, fp32: "
        f"{2 * args.layers * args.hidden * 4 // 1024} KiB of KV per token), a "
        f"{args.prompt_tokens}-token prompt sent once (computed, saved by the connector), "
        f"then {args.repeats} times: `LLM.reset_prefix_cache()` and the same prompt with "
        "one output token, timed from `generate` to its return (the time to first "
        "token, engine overhead included). Each configuration is a fresh engine in each "
        f"of {args.rounds} rounds that alternate the configurations; the median is over "
        "every round's requests. The prefix-cache column is the fastest request "
        "answered from vLLM's own cache (nothing loaded): the engine's floor.",
        "",
        "| configuration | TTFT ms, median (min-max) | x recompute | vLLM's own prefix-cache "
        "hit, ms (fastest) | tokens loaded by mouthguard | same tokens |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "| target | verdict |",
        "|---|---|",
        *verdicts,
        "",
        "Not runnable on this machine (the benchmark includes them where they run):",
        "",
        *[f"* {name}: {why}." for name, why in NOT_RUNNABLE],
        "",
        "A Mooncake-format trace replayed inside the engine (prefix hit rate, "
        "requests/s, TTFT p50/p90 for the same configurations) is in "
        "[benchmarks-vllm-replay.md](benchmarks-vllm-replay.md) "
        "(`python -m benchmarks.vllm.replay`).",
        "",
        "Weights: engine start to first token and load GiB/s for `load_format` "
        "`mouthguard` against vLLM's default and its peers are in "
        "[benchmarks-vllm-load.md](benchmarks-vllm-load.md) (`python -m benchmarks.vllm.load`).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated; on a GPU machine add {', '.join(GPU_CONFIGS)}",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-vllm.md")
    args = parser.parse_args()
    if args.quick:
        args.prompt_tokens, args.repeats, args.hidden, args.layers = 512, 2, 128, 2
        args.rounds = 1
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS) - set(GPU_CONFIGS))
    needed = {"recompute", "example"} - set(configs)
    if unknown or needed or not any(c.startswith("mouthguard") for c in configs):
        parser.error(
            f"--configs: unknown {unknown}, missing {sorted(needed)}; the report compares "
            "recompute, ExampleConnector and at least one mouthguard configuration"
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mg-vllm-bench-") as tmp:
        # rounds alternate the configurations, so a slow spell of a shared machine
        # does not land on one configuration only; each round is a fresh engine
        merged: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for config in configs:
                work = Path(tmp) / f"round-{round_}"
                work.mkdir(exist_ok=True)
                result = run_config(args.python, config, work, args)
                print(config, f"{result['ttft_median_s'] * 1e3:.0f} ms", file=sys.stderr)
                if config in merged:
                    previous = merged[config]
                    previous["ttft_s"] += result["ttft_s"]
                    previous["engine_cache_hit_s"] = min(
                        previous["engine_cache_hit_s"], result["engine_cache_hit_s"]
                    )
                    previous["tokens_match"] = previous["tokens"] == result["tokens"]
                else:
                    merged[config] = result
        results = list(merged.values())
        for result in results:
            result["ttft_median_s"] = statistics.median(result["ttft_s"])
    text = report(results, args, time.perf_counter() - started)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
