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

from typing_extensions import override

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
    @override
    def capabilities(self) -> TierCapabilities:
        return self.inner.capabilities

    @override
    def location(self, prefix: str = "") -> str:
        return self.inner.location(prefix)

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        return self.inner.put(key, data, mode=mode)

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self.inner.get(key, start, end)

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.inner.read_into(key, offset, out)

    @override
    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    @override
    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        return self.inner.list(prefix)

    @override
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Forwarded, not Tier's list-then-head: the inner listing may carry sizes.
        return self.inner.list_info(prefix)

    # ``builtins.list``: in the class body ``list`` names the method above.
    @override
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(prefix)

    @override
    def delete(self, key: str) -> bool:
        return self.inner.delete(key)

    @override
    def delete_prefix(self, prefix: str) -> int:
        # Forwarded, not Tier's loop of deletes: the inner tier may bulk-delete faster.
        return self.inner.delete_prefix(prefix)

    @override
    def rename_prefix(self, src: str, dst: str) -> None:
        # The inner tier refuses if it cannot rename atomically.
        self.inner.rename_prefix(src, dst)

    @override
    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        return self.inner.annotate(key, tags)

    @override
    def annotations(self, key: str) -> dict[str, str]:
        return self.inner.annotations(key)

    @override
    def set_legal_hold(self, key: str, on: bool) -> bool:
        return self.inner.set_legal_hold(key, on)

    @override
    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        return self.inner.collect_incomplete(prefix, older_than_seconds)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
