"""Mooncake-format trace requests as engine prompts (``prompt_token_ids``).

Pure (numpy only, no vLLM): the replay's engine script and its test share it. A
Mooncake ``hash_ids`` entry names one block of the prompt, chained (an equal id
means an equal prefix up to and including that block), so each id becomes the
same ``block_tokens`` pseudo-random token ids wherever it appears (seeded by the
id): requests sharing leading ids share that prefix token for token, and two
different ids give different blocks. The prompt is the blocks concatenated and
cut to ``input_length``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.kvcache.trace import Request

#: vLLM's block size on a CPU: the replay's hash ids name blocks of this many tokens.
BLOCK_TOKENS = 128


def block_tokens_of(hash_id: int, block_tokens: int, vocab: int) -> list[int]:
    """The ``block_tokens`` token ids of one hash id, in ``[1, vocab)``."""
    rng = np.random.default_rng([hash_id, block_tokens, vocab])
    return [int(t) for t in rng.integers(1, vocab, size=block_tokens)]


def prompt_of(request: Request, block_tokens: int, vocab: int) -> list[int]:
    """``request``'s prompt token ids (see the module docstring).

    Raises:
        ValueError: the request's ``input_length`` does not fall in its last hash
            id's block (``len(hash_ids) - 1`` full blocks, then 1 to
            ``block_tokens`` tokens), or a size is not positive.
    """
    if block_tokens < 1 or vocab < 2:
        raise ValueError(f"block_tokens {block_tokens} and vocab {vocab} must be positive")
    blocks = len(request.hash_ids)
    low, high = (blocks - 1) * block_tokens + 1, blocks * block_tokens
    if not low <= request.input_length <= high:
        raise ValueError(
            f"request at {request.timestamp}: input_length {request.input_length} needs "
            f"{-(-request.input_length // block_tokens)} blocks of {block_tokens} tokens, "
            f"its hash_ids name {blocks}"
        )
    tokens: list[int] = []
    for hash_id in request.hash_ids:
        tokens += block_tokens_of(hash_id, block_tokens, vocab)
    return tokens[: request.input_length]


def prompts_of(trace: Sequence[Request], block_tokens: int, vocab: int) -> list[list[int]]:
    """:func:`prompt_of` for every request, in trace order."""
    return [prompt_of(r, block_tokens, vocab) for r in trace]


def reusable_tokens(trace: Sequence[Request], block_tokens: int) -> list[int]:
    """Per request, the prompt tokens an unbounded prefix store could give back.

    The whole blocks of the longest prefix an earlier request already had, short
    of the prompt's last token (the engine computes at least that one): the
    ceiling on any connector's hit rate for this trace.
    """
    seen: set[tuple[int, ...]] = set()
    out = []
    for request in trace:
        keys = [tuple(request.hash_ids[: i + 1]) for i in range(len(request.hash_ids))]
        covered = 0
        while covered < len(keys) and keys[covered] in seen:
            covered += 1
        usable = min(covered * block_tokens, request.input_length - 1)
        out.append(usable - usable % block_tokens)
        full = request.input_length // block_tokens  # only full blocks are ever stored
        seen.update(keys[:full])
    return out
