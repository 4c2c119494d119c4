"""A tiny random-weight Llama built locally (nothing downloaded), and a store for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mouthguard.kvcache import KVStore
from mouthguard.kvcache.hf import PrefixReuse, namespace_for

BLOCK_TOKENS = 16


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def open_store(directory: Path, model: Any) -> KVStore:
    return KVStore(
        disk_dir=directory,
        memory_bytes=1 << 20,
        disk_bytes=8 << 20,
        block_tokens=BLOCK_TOKENS,
        namespace=namespace_for(model, "tiny-llama-seed0", BLOCK_TOKENS),
    )


def prompts() -> tuple[list[int], list[int]]:
    """Two prompts sharing their first 96 tokens (a system prompt and a history)."""
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 1000, (96,), generator=g).tolist()
    first = shared + torch.randint(0, 1000, (21,), generator=g).tolist()
    second = shared + torch.randint(0, 1000, (13,), generator=g).tolist()
    return first, second


if __name__ == "__main__":  # a new process: python -m tests.kvcache.hf_model DIR
    model = tiny_llama()
    _, second = prompts()
    with open_store(Path(sys.argv[1]), model) as store:
        result = PrefixReuse(model, store).generate(second, 12)
    print(json.dumps(result.__dict__))
