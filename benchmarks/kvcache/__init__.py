"""KV-cache benchmark: a shared-prefix trace replayed against KVStore and its peers.

``python -m benchmarks.kvcache`` (see ``docs/kvcache.md`` for what each figure counts).
"""
