"""The naive peer: one file per block hash in a directory, LRU by deleting files.

What many KV offload tools do: a put writes ``<dir>/<hash>.bin`` (temporary
file, rename), a get reads it whole, an eviction unlinks it; capacity is the
sum of the files' sizes. No checksum, no index: a restart lists the directory.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np


class NaiveStore:
    def __init__(self, directory: Path, capacity: int) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.lru: OrderedDict[str, int] = OrderedDict()
        self.bytes = 0
        self.latencies: list[float] = []
        self.read_bytes = 0

    def _name(self, ids: list[int], i: int) -> str:
        return f"{hash(tuple(ids[: i + 1])) & 0xFFFFFFFFFFFFFFFF:016x}"

    def longest_prefix(self, ids: list[int]) -> int:
        n = 0
        while n < len(ids) and self._name(ids, n) in self.lru:
            n += 1
        return n

    def get(self, ids: list[int], n: int) -> list[np.ndarray]:
        out = []
        for i in range(n):
            name = self._name(ids, i)
            started = time.perf_counter()
            data = np.fromfile(self.dir / f"{name}.bin", dtype=np.uint8)
            self.latencies.append(time.perf_counter() - started)
            self.read_bytes += data.nbytes
            self.lru.move_to_end(name)
            out.append(data)
        return out

    def put(self, ids: list[int], start: int, block: np.ndarray) -> None:
        for i in range(start, len(ids)):
            name = self._name(ids, i)
            if name in self.lru:
                continue
            while self.bytes + block.nbytes > self.capacity and self.lru:
                old, size = self.lru.popitem(last=False)
                (self.dir / f"{old}.bin").unlink()
                self.bytes -= size
            tmp = self.dir / f".{name}.tmp"
            block.tofile(tmp)
            tmp.rename(self.dir / f"{name}.bin")
            self.lru[name] = block.nbytes
            self.bytes += block.nbytes
