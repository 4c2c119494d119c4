"""One configuration's replay of a Mooncake-format trace inside a vLLM engine.

Run with the vLLM environment's interpreter (``benchmarks.vllm.replay`` does)::

    .venv-vllm/bin/python benchmarks/vllm/replay_engine.py --config mouthguard-ram \\
        --trace trace.jsonl --work /tmp/w

Starts one engine with the configuration named (the names of
``benchmarks/vllm/ttft.py``), then sends the trace's requests one at a time, in
trace order (closed loop: the timestamps only order them), each as
``prompt_token_ids`` built by :mod:`benchmarks.vllm.trace_prompts`, with
``max_tokens = min(output_length, --max-output)`` and greedy sampling. Before every
request ``LLM.reset_prefix_cache()`` empties the engine's own prefix cache, so a
prefix that is not recomputed came from the connector. Per request it records the
time to first token (vLLM's own ``first_token_latency``: from the request's arrival
in the engine to its first token), the prompt tokens the engine did not compute
(``num_cached_tokens``: here, the connector's), the connector's counts where it
reports them, and the output tokens. Writes them as JSON to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository and the engine helpers
    sys.path.insert(0, str(Path(__file__).parents[2]))
    sys.path.insert(0, str(Path(__file__).parents[2] / "tests/integrations/vllm_scripts"))
from common import close_engine, start_engine

from benchmarks.kvcache import trace as traces
from benchmarks.vllm.trace_prompts import BLOCK_TOKENS, prompts_of
from benchmarks.vllm.ttft import bench_model, engine_options

VOCAB = 32000  # bench_model's vocabulary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("--max-output", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import SamplingParams  # noqa: PLC0415 - after the environment is set

    trace = traces.read(args.trace)
    prompts = prompts_of(trace, BLOCK_TOKENS, VOCAB)
    model = bench_model(args.work / f"model-{args.hidden}-{args.layers}", args.hidden, args.layers)
    llm = start_engine(
        model,
        **engine_options(args.config, args.work),
        disable_log_stats=False,  # RequestOutput.metrics: the engine's own TTFT
    )
    block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
    if block_size != BLOCK_TOKENS:
        raise SystemExit(f"the engine's block size is {block_size}, the trace's {BLOCK_TOKENS}")
    rows = []
    started = time.perf_counter()
    for request, prompt in zip(trace, prompts, strict=True):
        llm.reset_prefix_cache()
        params = SamplingParams(
            max_tokens=max(1, min(request.output_length, args.max_output)),
            temperature=0.0,
            ignore_eos=True,
        )
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        counts = (out.kv_transfer_params or {}).get("mouthguard", {})
        metrics = out.metrics
        if metrics is None or not metrics.first_token_latency:
            raise SystemExit("the engine reported no first-token latency")
        rows.append(
            {
                "prompt_tokens": len(prompt),
                "ttft_s": float(metrics.first_token_latency),
                "cached_tokens": int(out.num_cached_tokens or 0),
                "loaded_tokens": counts.get("loaded_tokens"),
                "failed_tokens": counts.get("failed_tokens"),
                "tokens": list(out.outputs[0].token_ids),
            }
        )
    seconds = time.perf_counter() - started
    args.result.write_text(
        json.dumps({"config": args.config, "seconds": seconds, "requests": rows})
    )
    close_engine(llm)
    os._exit(0)  # the engine's background threads need not be joined


if __name__ == "__main__":
    main()
