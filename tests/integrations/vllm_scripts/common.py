"""Shared by the engine scripts and ``benchmarks/vllm`` (run with vLLM's interpreter).

Imports only the standard library at module level: the scripts import vLLM and
transformers inside ``main`` (the engine spawns processes that re-import them).
"""

from __future__ import annotations

import gc
import json
import os
import random
from pathlib import Path
from typing import Any

#: The tiny model of every engine test: random weights, nothing downloaded.
MODEL = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
}


def quiet_engine() -> None:
    """Small KV space and little logging: the engine shares a small CI machine."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def make_model(directory: Path, **overrides: int) -> Path:
    """Save a random-weight Llama (seed 0) with ``save_pretrained``; kept if already there.

    ``overrides`` change :data:`MODEL`'s ``LlamaConfig`` fields (a bigger model for
    the benchmarks); one directory holds one configuration.
    """
    if (directory / "config.json").exists():
        return directory
    import torch  # noqa: PLC0415 - the vLLM environment's, imported in the script's main
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**(MODEL | overrides))).save_pretrained(directory)
    return directory


#: vLLM's switch between an engine in its own processes ("1", the default) and in the caller's.
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def start_engine(model: Path, *, in_process: bool = False, **options: Any) -> Any:
    """``vllm.LLM`` on ``model`` as every engine script runs it, plus ``options``.

    No tokenizer (prompts are token ids), eager mode (no graph capture to wait
    for), float32 and seed 0, so two engines given the same prompts agree token
    for token; ``options`` adds the load format or the KV transfer config.

    By default the engine has the layout a user's ``LLM(...)`` gets on CPU: an
    engine-core process and a worker process, each of which imports vLLM and torch
    again (about 25 of the 31 s a start takes here). ``in_process=True`` runs the
    core and its one worker in this process instead (vLLM's
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, about 7 s): for the engines whose process
    layout is not what they test, such as the reference engines whose tokens the
    others are compared with. The setting applies to this start only.
    """
    import vllm.envs  # noqa: PLC0415 - the engine only in the script's main
    from vllm import LLM  # noqa: PLC0415

    # An engine started in this process caches vLLM's environment variables for good;
    # this start must read them again, or it inherits the last one's layout.
    vllm.envs.disable_envs_cache()
    previous = os.environ.get(MULTIPROCESSING)
    if in_process:
        os.environ[MULTIPROCESSING] = "0"
    try:
        return LLM(
            model=str(model),
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="float32",
            seed=0,
            **options,
        )
    finally:
        if previous is None:
            os.environ.pop(MULTIPROCESSING, None)
        else:
            os.environ[MULTIPROCESSING] = previous


def close_engine(llm: Any) -> None:
    """Shut the engine's core process down now, so the next engine gets its memory."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def prompt(seed: int, length: int) -> list[int]:
    """``length`` token ids in ``[1, vocabulary)``, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(1, MODEL["vocab_size"]) for _ in range(length)]


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The script's answer for the test, as JSON."""
    path.write_text(json.dumps(result, indent=1))
