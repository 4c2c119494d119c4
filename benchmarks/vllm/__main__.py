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
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["recompute", "example", "mouthguard-ram", "mouthguard-disk", "mouthguard-disk-async"]
LABELS = {
    "recompute": "no offloading (prefill recomputed)",
    "example": "vLLM ExampleConnector (safetensors file per layer, disk)",
    "mouthguard-ram": "MouthguardConnector, blocks in RAM",
    "mouthguard-disk": "MouthguardConnector, blocks on disk (4 MiB RAM tier)",
    "mouthguard-disk-async": "MouthguardConnector, blocks on disk, `async_load` on",
}
NOT_RUNNABLE = [
    (
        'vLLM native offloading (`kv_offloading_backend="native"`)',
        'refuses to start on a CPU: "CPU Offloading is currently only supported on '
        'CUDA-alike and XPU GPUs"',
    ),
    ("LMCache", "its vLLM connector needs CUDA packages (cupy, cuda-python, cufile)"),
]


def run_config(python: Path, config: str, work: Path, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    command = [
        str(python),
        str(ROOT / "benchmarks" / "vllm" / "ttft.py"),
        "--config",
        config,
        "--work",
        str(work),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--repeats",
        str(args.repeats),
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-5000:] + done.stderr[-5000:])
        raise SystemExit(f"{config} failed ({done.returncode})")
    return json.loads(lines[-1])


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
    mg = min(by[c]["ttft_median_s"] for c in ("mouthguard-ram", "mouthguard-disk"))
    mg_disk = by["mouthguard-disk"]["ttft_median_s"]
    peer = by["example"]["ttft_median_s"]
    identical = all(r["tokens"] == reference and r.get("tokens_match", True) for r in results)
    verdicts = [
        f"| tokens identical in every configuration | {'met' if identical else 'NOT met'} |",
        f"| TTFT of a prefix hit <= 0.5x recompute (disk tier: {mg_disk / base:.2f}x; "
        f"RAM tier: {by['mouthguard-ram']['ttft_median_s'] / base:.2f}x) | "
        f"{'met' if mg_disk <= 0.5 * base else 'NOT met'} |",
        f"| TTFT of a prefix hit <= the best peer measured here (ExampleConnector "
        f"{peer * 1e3:.0f} ms; mouthguard best {mg * 1e3:.0f} ms, disk {mg_disk * 1e3:.0f} ms) | "
        f"{'met' if mg_disk <= peer else 'NOT met'} |",
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
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-vllm.md")
    args = parser.parse_args()
    if args.quick:
        args.prompt_tokens, args.repeats, args.hidden, args.layers = 512, 2, 128, 2
        args.rounds = 1
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mg-vllm-bench-") as tmp:
        # rounds alternate the configurations, so a slow spell of a shared machine
        # does not land on one configuration only; each round is a fresh engine
        merged: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for config in CONFIGS:
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
