"""A tiered store for attention (KV) blocks: memory, local disk, and any tier as remote.

``KVStore`` keeps blocks under prefix-chained keys, so an inference engine asks
"how much of this prompt is already computed" (``longest_prefix``) and takes
those blocks back (``get``) instead of recomputing the prefill. See
``docs/kvcache.md`` for the design and ``mouthguard.kvcache.hf`` for a client.
"""

from __future__ import annotations

from mouthguard.kvcache.keys import KEY_VERSION, KVNamespace
from mouthguard.kvcache.store import IMPORTANCE, KVStore

__all__ = ["IMPORTANCE", "KEY_VERSION", "KVNamespace", "KVStore"]
