"""Prefix reuse for Hugging Face ``transformers`` generation through a :class:`KVStore`.

:class:`PrefixReuse` runs greedy generation for a decoder-only model (Llama and
its relatives, whose cache is a ``DynamicCache``). Before the prefill it asks
the store how much of the prompt is already computed, rebuilds a
``DynamicCache`` from the stored blocks of that prefix, and runs the model only
on the remaining tokens; after the prefill it stores the prompt's new full
blocks. A second request sharing a long prefix with an earlier one -- in this
process or, through the disk and remote tiers, in another -- skips that part of
the prefill and produces the same tokens.

Block layout: one tensor per block of ``block_tokens`` tokens, shape
``[layers, 2, kv_heads, block_tokens, head_dim]`` (2 = key, value) in the
model's dtype, batch size 1. :func:`namespace_for` puts the model id, dtype,
that layout and the tensor-parallel rank into the key namespace.

The same three calls serve an inference engine's connector: vLLM's
``KVConnector`` asks ``get_num_new_matched_tokens`` (``longest_prefix``), loads
the matched blocks into its paged buffers (``get(..., out=pool_views)`` or
``device=``, after ``pin``/``prefetch`` when the load is scheduled for later),
and saves computed blocks (``put(..., wait=False)``); SGLang's HiCache storage
backend maps its page hashes to the same ``put``/``get``/``contains`` calls.
See ``docs/kvcache.md``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from mouthguard.errors import KVCacheError
from mouthguard.kvcache.keys import KVNamespace
from mouthguard.kvcache.store import KVStore


@dataclass(frozen=True)
class Generation:
    """The result of one greedy generation.

    Attributes:
        tokens: the generated token ids (not the prompt).
        prefill_computed: prompt tokens the model ran on.
        prefill_reused: prompt tokens whose K/V came from the store.
        blocks_stored: new blocks this request put into the store.
    """

    tokens: list[int]
    prefill_computed: int
    prefill_reused: int
    blocks_stored: int


def _config(model: Any) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def kv_shape(model: Any, block_tokens: int) -> tuple[int, int, int, int, int]:
    """``[layers, 2, kv_heads, block_tokens, head_dim]`` of one block for ``model``."""
    config = _config(model)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return (config.num_hidden_layers, 2, kv_heads, block_tokens, head_dim)


def namespace_for(model: Any, model_id: str, block_tokens: int, tp_rank: int = 0) -> KVNamespace:
    """The key namespace of ``model``'s blocks (id, dtype, layout, tensor-parallel rank)."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    layout = "hf-dynamic:[layers,2,kv_heads,tokens,head_dim]=" + ",".join(
        str(d) for d in kv_shape(model, block_tokens)
    )
    return KVNamespace(model_id=model_id, dtype=dtype, layout=layout, tp_rank=tp_rank)


def _cache_argument(model: Any) -> str:
    # transformers 5 renamed ``past_key_values`` to ``cache``.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers 4


class PrefixReuse:
    """Greedy generation with the prompt's KV blocks taken from and given to ``store``.

    Args:
        model: a decoder-only ``transformers`` model in eval mode (batch size 1).
        store: a KVStore whose namespace is :func:`namespace_for` this model.
    """

    def __init__(self, model: Any, store: KVStore) -> None:
        self.model = model
        self.store = store
        self.block_tokens = store.block_tokens
        self.shape = kv_shape(model, self.block_tokens)
        self._cache_arg = _cache_argument(model)

    def _cache_from(self, blocks: list[torch.Tensor]) -> Any:
        from transformers import DynamicCache  # noqa: PLC0415 - transformers is optional

        config = _config(self.model)
        cache = DynamicCache(config=config)
        device = next(self.model.parameters()).device
        whole = torch.cat(blocks, dim=3).to(device)  # [layers, 2, heads, tokens, dim]
        for layer in range(whole.shape[0]):
            cache.update(whole[layer, 0].unsqueeze(0), whole[layer, 1].unsqueeze(0), layer)
        return cache

    def _blocks_of(self, cache: Any, start_block: int, end_block: int) -> list[torch.Tensor]:
        layers = _layers(cache)
        keys = torch.stack([k[0] for k, _ in layers])  # [layers, heads, tokens, dim]
        values = torch.stack([v[0] for _, v in layers])
        both = torch.stack([keys, values], dim=1)  # [layers, 2, heads, tokens, dim]
        bt = self.block_tokens
        return [both[:, :, :, i * bt : (i + 1) * bt] for i in range(start_block, end_block)]

    def _forward(self, tokens: list[int], cache: Any) -> tuple[torch.Tensor, Any]:
        device = next(self.model.parameters()).device
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        kwargs = {self._cache_arg: cache, "use_cache": True}
        out = self.model(input_ids=ids, **kwargs)
        returned = getattr(out, "past_key_values", None)
        return out.logits[0, -1], returned if returned is not None else cache

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int, *, reuse: bool = True) -> Generation:
        """Greedy-generate ``max_new_tokens`` after ``prompt`` (see the module docstring).

        With ``reuse=False`` the store is neither read nor written (the reference run).

        Raises:
            KVCacheError: an empty prompt.
        """
        if not prompt:
            raise KVCacheError("generation needs a non-empty prompt")
        bt = self.block_tokens
        reused, cache = 0, None
        if reuse:
            # Keep at least one prompt token to run: its logits give the first new token.
            usable = min(self.store.longest_prefix(prompt), (len(prompt) - 1) // bt * bt)
            if usable:
                pinned = self.store.pin(prompt[:usable])
                try:
                    blocks = self.store.get(prompt[:usable])
                finally:
                    self.store.unpin(prompt[:usable], pinned)
                if any(tuple(b.shape) != self.shape for b in blocks):
                    raise KVCacheError("stored blocks do not have this model's layout")
                reused = len(blocks) * bt
                cache = self._cache_from(blocks) if blocks else None
        if cache is None:
            from transformers import DynamicCache  # noqa: PLC0415 - transformers is optional

            cache = DynamicCache(config=_config(self.model))
        logits, cache = self._forward(prompt[reused:], cache)
        stored = 0
        if reuse:
            full = len(prompt) // bt
            new = self._blocks_of(cache, reused // bt, full)
            blocks_to_put: list[torch.Tensor | None] = [None] * (reused // bt)
            blocks_to_put.extend(new)  # None: already stored, skipped
            stored = self.store.put(prompt[: full * bt], blocks_to_put)
        generated: list[int] = []
        for _ in range(max_new_tokens):
            token = int(torch.argmax(logits).item())
            generated.append(token)
            if len(generated) == max_new_tokens:
                break
            logits, cache = self._forward([token], cache)
        return Generation(generated, len(prompt) - reused, reused, stored)
