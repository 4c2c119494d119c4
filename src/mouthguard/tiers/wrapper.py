"""The base of tier decorators: a tier that forwards every operation to another.

Cross-cutting features (pacing, fault injection, encryption) are wrappers that
take a tier and return a tier. :class:`WrappedTier` forwards *everything* --
data operations, capabilities, annotations, legal holds, debris collection --
so a subclass overrides only what it changes, and a new operation of the tier
interface cannot be silently dropped by one wrapper and not the others.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping

from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, TierCapabilities


class WrappedTier(Tier):
    """Forwards every operation to ``inner``; keeps its name and failure domain.

    Attributes:
        inner: the tier that stores the bytes.
    """

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner.name, inner.domain)
        self.inner = inner

    @property
    def capabilities(self) -> TierCapabilities:
        """The inner tier's capabilities."""
        return self.inner.capabilities

    def location(self, prefix: str = "") -> str:
        """The inner tier's location of ``prefix``."""
        return self.inner.location(prefix)

    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Forwarded."""
        return self.inner.put(key, data, mode=mode)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Forwarded."""
        return self.inner.get(key, start, end)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Forwarded."""
        self.inner.read_into(key, offset, out)

    def head(self, key: str) -> ObjectInfo:
        """Forwarded."""
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        """Forwarded."""
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        """Forwarded."""
        return self.inner.list(prefix)

    # ``builtins.list``: in the class body ``list`` names the method above.
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Forwarded."""
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> bool:
        """Forwarded."""
        return self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        """Forwarded (the inner tier may have a faster bulk delete)."""
        return self.inner.delete_prefix(prefix)

    def rename_prefix(self, src: str, dst: str) -> None:
        """Forwarded (the inner tier refuses if it cannot rename atomically)."""
        self.inner.rename_prefix(src, dst)

    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Forwarded."""
        return self.inner.annotate(key, tags)

    def annotations(self, key: str) -> dict[str, str]:
        """Forwarded."""
        return self.inner.annotations(key)

    def set_legal_hold(self, key: str, on: bool) -> bool:
        """Forwarded."""
        return self.inner.set_legal_hold(key, on)

    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        """Forwarded."""
        return self.inner.collect_incomplete(prefix, older_than_seconds)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
