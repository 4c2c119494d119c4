"""Writing datasets: shards, then the manifest that commits them.

:mod:`.writer` (shards and the manifest, written last), :mod:`.pack` (a directory of
files into shards) and :mod:`.upload` (a shard streamed to a tier as it is written).
"""
