"""Eviction order within one tier: LRU (the default) and S3-FIFO (scan-resistant).

A policy only orders keys; the tier owns the bytes and the locking (every call
is made under the store's lock). :meth:`EvictionPolicy.pop_victim` hands out the
next key to evict among those the tier says are ``eligible`` (not pinned, not
being moved) and forgets it; ineligible keys keep their place.

S3-FIFO (Yang et al., SOSP 2023) keeps a small FIFO for new keys (10% of the
bytes), a main FIFO, and a ghost list of keys recently evicted from the small
one. A key read at most once while in the small queue leaves without ever
touching the main queue, so a one-pass scan over many cold prefixes cannot flush
the hot shared prefixes (system prompts) out of the tier, as it does under LRU.
"""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable

from mouthguard.errors import KVCacheError

#: S3-FIFO's share of bytes for the small (probationary) queue.
SMALL_SHARE = 0.1
#: S3-FIFO's frequency saturates here (two bits in the paper).
MAX_FREQ = 3


class EvictionPolicy(abc.ABC):
    """The order in which a tier gives up its blocks."""

    @abc.abstractmethod
    def insert(self, key: bytes, size: int) -> None:
        """Track a key that just entered the tier."""

    @abc.abstractmethod
    def hit(self, key: bytes) -> None:
        """Note a read of ``key`` (a no-op for keys not tracked)."""

    @abc.abstractmethod
    def remove(self, key: bytes) -> None:
        """Forget ``key`` (deleted or moved away); a no-op for keys not tracked."""

    @abc.abstractmethod
    def pop_victim(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        """Forget and return the next eligible key to evict; None if there is none."""

    @abc.abstractmethod
    def __len__(self) -> int: ...


class LRU(EvictionPolicy):
    """Least recently used first."""

    def __init__(self) -> None:
        self._order: OrderedDict[bytes, int] = OrderedDict()

    def insert(self, key: bytes, size: int) -> None:
        """Track ``key`` as the most recently used."""
        self._order[key] = size
        self._order.move_to_end(key)

    def hit(self, key: bytes) -> None:
        """Make ``key`` the most recently used."""
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key: bytes) -> None:
        """Forget ``key``."""
        self._order.pop(key, None)

    def pop_victim(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        """The least recently used eligible key."""
        for key in self._order:
            if eligible(key):
                del self._order[key]
                return key
        return None

    def __len__(self) -> int:
        return len(self._order)


class S3FIFO(EvictionPolicy):
    """S3-FIFO over bytes (see the module docstring).

    Args:
        capacity: the tier's capacity in bytes (sizes the small queue).
    """

    def __init__(self, capacity: int) -> None:
        self._small_limit = max(1, int(capacity * SMALL_SHARE))
        self._small: OrderedDict[bytes, int] = OrderedDict()  # oldest first
        self._main: OrderedDict[bytes, int] = OrderedDict()
        self._freq: dict[bytes, int] = {}
        self._ghost: OrderedDict[bytes, None] = OrderedDict()
        self._small_bytes = 0

    def insert(self, key: bytes, size: int) -> None:
        """New keys start in the small queue, unless the ghost list remembers them."""
        self.remove(key)
        self._freq[key] = 0
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = size
        else:
            self._small[key] = size
            self._small_bytes += size

    def hit(self, key: bytes) -> None:
        """Count a read (saturating); the queues do not move on a hit."""
        if key in self._freq:
            self._freq[key] = min(self._freq[key] + 1, MAX_FREQ)

    def remove(self, key: bytes) -> None:
        """Forget ``key`` everywhere but the ghost list."""
        if key in self._small:
            self._small_bytes -= self._small.pop(key)
        self._main.pop(key, None)
        self._freq.pop(key, None)

    def pop_victim(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        """Evict from the small queue while it is over its share, else from main."""
        # Every key is looked at a bounded number of times: each pass either
        # evicts, promotes small -> main, or lowers a frequency (at most MAX_FREQ).
        budget = (len(self._small) + len(self._main)) * (MAX_FREQ + 2) + 1
        while budget > 0 and (self._small or self._main):
            budget -= 1
            if self._small and (self._small_bytes > self._small_limit or not self._main):
                victim = self._from_small(eligible)
            else:
                victim = self._from_main(eligible)
            if victim is not None:
                return victim
            if not self._has_eligible(eligible):
                return None
        return None

    def _has_eligible(self, eligible: Callable[[bytes], bool]) -> bool:
        return any(eligible(k) for k in self._small) or any(eligible(k) for k in self._main)

    def _from_small(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        key, size = self._small.popitem(last=False)
        self._small_bytes -= size
        if not eligible(key):
            self._small[key] = size  # keeps its frequency, goes to the back
            self._small_bytes += size
            return None
        if self._freq.get(key, 0) > 0:
            self._main[key] = size  # read again while on probation: it stays
            self._freq[key] = 0
            return None
        del self._freq[key]
        self._ghost[key] = None
        while len(self._ghost) > max(len(self._main), 16):
            self._ghost.popitem(last=False)
        return key

    def _from_main(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        key, size = self._main.popitem(last=False)
        if not eligible(key):
            self._main[key] = size
            return None
        if self._freq.get(key, 0) > 0:
            self._freq[key] -= 1
            self._main[key] = size
            return None
        del self._freq[key]
        return key

    def __len__(self) -> int:
        return len(self._small) + len(self._main)


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """``"lru"`` or ``"s3fifo"`` for a tier of ``capacity`` bytes.

    Raises:
        KVCacheError: an unknown policy name.
    """
    if name == "lru":
        return LRU()
    if name == "s3fifo":
        return S3FIFO(capacity)
    raise KVCacheError(f"unknown eviction policy {name!r}; expected 'lru' or 's3fifo'")
