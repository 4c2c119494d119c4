"""An in-process RAM tier: the fastest tier, and the reference implementation of the contract.

:class:`MemoryTier` keeps every object as an immutable ``bytes`` value in a dict
guarded by one lock. Each write gets the next number of a per-tier counter as
its ``etag`` (a generation stamp: cheap, and unique within the tier's life). It
is neither durable nor persistent: its objects vanish with the process (or with
the instance). It exists for a node-local "fast"
tier and for tests, and it deliberately implements every rule of
:mod:`mouthguard.tiers.base` exactly, including atomic ``rename_prefix`` and
atomic ``PutMode.CREATE``.
"""

from __future__ import annotations

import builtins
import itertools
import threading
import time
from collections.abc import Iterator, Mapping

from typing_extensions import override

from mouthguard.errors import ObjectExistsError, ObjectNotFoundError
from mouthguard.tiers.base import (
    ObjectInfo,
    PutData,
    PutMode,
    Tier,
    TierCapabilities,
    iter_buffers,
)
from mouthguard.tiers.object_keys import (
    validate_dir_prefix,
    validate_key,
    validate_prefix,
    validate_rename,
)
from mouthguard.tiers.ranges import check_range

_CAPABILITIES = TierCapabilities(
    atomic_rename=True,
    conditional_put=True,
    object_lock=False,
    durable=False,
    persistent=False,
)


class MemoryTier(Tier):
    """A thread-safe tier holding objects in a dict, copied on the way in.

    Args:
        name: the tier's name in the store configuration.
        domain: the failure domain (``"ram"``: lost with the process).
    """

    def __init__(self, name: str = "memory", domain: str = "ram") -> None:
        super().__init__(name, domain)
        # One lock for everything: operations are O(n) at worst and the lock is
        # what makes CREATE and rename_prefix atomic.
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, float, str]] = {}  # blob, mtime, etag
        self._generations = itertools.count(1)
        self._tags: dict[str, dict[str, str]] = {}

    @property
    @override
    def capabilities(self) -> TierCapabilities:
        """Atomic rename and conditional put; neither durable nor persistent."""
        return _CAPABILITIES

    @override
    def location(self, prefix: str = "") -> str:
        """Return ``memory://<name>/<prefix>``."""
        validate_prefix(prefix)
        return f"memory://{self.name}/{prefix}"

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Store a private copy of ``data`` under ``key``.

        Each chunk is copied as it arrives, because a streaming caller may refill
        the same buffer for the next chunk. The object becomes visible only once
        complete: an exception from ``data`` leaves the tier unchanged.

        Raises:
            InvalidKeyError: ``key`` is not a valid key.
            ObjectExistsError: ``mode`` is CREATE and ``key`` exists (checked atomically).
        """
        validate_key(key)
        parts = [bytes(chunk) for chunk in iter_buffers(data)]
        blob = parts[0] if len(parts) == 1 else b"".join(parts)
        mtime = time.time()
        with self._lock:
            if mode is PutMode.CREATE and key in self._objects:
                raise ObjectExistsError(f"object {key!r} already exists on tier {self.name!r}")
            etag = f"g{next(self._generations)}"
            self._objects[key] = (blob, mtime, etag)
            self._tags.pop(key, None)  # a new object starts without the old one's tags
        return ObjectInfo(key, len(blob), mtime, etag)

    def _blob(self, key: str) -> bytes:
        validate_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise ObjectNotFoundError(f"object {key!r} not found on tier {self.name!r}")
        return entry[0]

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return bytes ``[start, end)`` of the object.

        Raises:
            InvalidKeyError: ``key`` is not a valid key.
            ObjectNotFoundError: no object under ``key``.
            TierError: the range is negative, reversed or past the end.
        """
        blob = self._blob(key)
        stop = check_range(key, len(blob), start, end)
        if start == 0 and stop == len(blob):
            return blob
        return blob[start:stop]

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Copy the object's bytes ``[offset, offset + out.nbytes)`` straight into ``out``.

        Raises:
            InvalidKeyError: ``key`` is not a valid key.
            ObjectNotFoundError: no object under ``key``.
            TierError: the range runs past the object's end.
        """
        blob = self._blob(key)
        target = out.cast("B")
        stop = check_range(key, len(blob), offset, offset + target.nbytes)
        target[:] = memoryview(blob)[offset:stop]

    @override
    def head(self, key: str) -> ObjectInfo:
        """Return the object's info or raise :class:`ObjectNotFoundError`."""
        validate_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise ObjectNotFoundError(f"object {key!r} not found on tier {self.name!r}")
        return ObjectInfo(key, len(entry[0]), entry[1], entry[2])

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        """Return an iterator over a sorted snapshot of the keys starting with ``prefix``."""
        validate_prefix(prefix)
        with self._lock:
            keys = [k for k in self._objects if k.startswith(prefix)]
        keys.sort()
        return iter(keys)

    @override
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Return an iterator over a sorted snapshot of the objects starting with ``prefix``."""
        validate_prefix(prefix)
        with self._lock:
            infos = [
                ObjectInfo(k, len(blob), mtime, etag)
                for k, (blob, mtime, etag) in self._objects.items()
                if k.startswith(prefix)
            ]
        infos.sort(key=lambda info: info.key)
        return iter(infos)

    # ``builtins.list``: in the class body ``list`` names the method above.
    @override
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return the sorted names ``n`` such that an object lives below ``prefix + n + "/"``.

        Raises:
            InvalidKeyError: ``prefix`` is invalid or neither empty nor ``/``-terminated.
        """
        validate_dir_prefix(prefix)
        with self._lock:
            keys = [k for k in self._objects if k.startswith(prefix)]
        names = {rest.split("/", 1)[0] for k in keys if "/" in (rest := k[len(prefix) :])}
        return sorted(names)

    @override
    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        validate_key(key)
        with self._lock:
            self._tags.pop(key, None)
            return self._objects.pop(key, None) is not None

    @override
    def rename_prefix(self, src: str, dst: str) -> None:
        """Move every object under ``src/`` to ``dst/`` in one step under the lock.

        Raises:
            InvalidKeyError: ``src`` or ``dst`` is not a valid key.
            TierError: the prefixes overlap.
            ObjectNotFoundError: nothing exists under ``src/``.
            ObjectExistsError: ``dst/`` already holds an object.
        """
        src_p, dst_p = validate_rename(src, dst)
        with self._lock:
            moving = [k for k in self._objects if k.startswith(src_p)]
            if not moving:
                raise ObjectNotFoundError(f"nothing under {src_p!r} on tier {self.name!r}")
            if any(k.startswith(dst_p) for k in self._objects):
                raise ObjectExistsError(f"destination {dst_p!r} is not empty on {self.name!r}")
            for k in moving:
                self._objects[dst_p + k[len(src_p) :]] = self._objects.pop(k)
                if k in self._tags:
                    self._tags[dst_p + k[len(src_p) :]] = self._tags.pop(k)

    @override
    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Store advisory tags with the object (they move with it and die with it)."""
        validate_key(key)
        with self._lock:
            if key not in self._objects:
                raise ObjectNotFoundError(f"{key!r} not found on tier {self.name!r}")
            self._tags.setdefault(key, {}).update(tags)
        return True

    @override
    def annotations(self, key: str) -> dict[str, str]:
        """The advisory tags stored with ``key``."""
        validate_key(key)
        with self._lock:
            return dict(self._tags.get(key, {}))
