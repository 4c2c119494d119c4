"""The tier interface: one narrow contract over RAM, POSIX directories and object stores.

A tier stores immutable-ish objects under ``/``-separated keys. It has six
operations (``put``, ``get``, ``read_into``, ``head``, ``list``, ``delete``)
plus ``rename_prefix`` where the tier declares ``atomic_rename``, and
``list_info``, the listing with each object's size and version stamp. What a tier
can do is declared as data in :class:`TierCapabilities`, never guessed from its
class, so the commit protocol can pick the safe path for each tier.

Contracts every implementation keeps (checked by the conformance suite,
:mod:`mouthguard.testing.conformance`):

* Keys are validated with :func:`mouthguard.tiers.object_keys.validate_key` before any
  I/O: nothing is ever read or written outside the tier's root.
* ``put`` is all-or-nothing: a reader sees either the previous object (or none)
  or the complete new one, never a prefix of it. On a durable tier the object
  (and its directory entry) is on stable storage when ``put`` returns.
* ``put(mode=PutMode.CREATE)`` raises :class:`ObjectExistsError` if the key
  exists; where the tier declares ``conditional_put`` the check is atomic.
* ``get``/``read_into`` of a missing key raise :class:`ObjectNotFoundError`;
  reading past the end is an error, never a silent short read.
* ``list(prefix)`` yields keys (sorted) of complete objects only; a tier's own
  temporary files are invisible.
* ``list_info(prefix)`` yields an :class:`ObjectInfo` per key ``list`` yields, in
  the same order, with the size ``head`` reports and, where the tier knows one,
  the same ``etag`` as ``head``: a stamp that changes whenever the object is
  written again (S3's ETag; on POSIX the file's mtime and inode). A consumer
  keys freshness on ``(size, etag)`` and learns sizes without a ``head`` each.
* ``delete`` of a missing key is not an error (it returns ``False``).
* ``rename_prefix(src, dst)`` moves every object under ``src/`` to ``dst/``
  atomically and fails with :class:`ObjectExistsError` if ``dst/`` holds anything.
"""

from __future__ import annotations

import abc
import builtins
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from typing_extensions import override

from mouthguard.errors import ObjectNotFoundError, UnsupportedOperationError

#: One contiguous chunk of bytes.
BytesLike = bytes | bytearray | memoryview

#: What ``put`` accepts: one buffer, or an iterable of buffers written in order.
#: Streaming lets a multi-GiB rank file be written without assembling it in memory.
PutData = BytesLike | Iterable[BytesLike]


class PutMode(enum.Enum):
    """Whether ``put`` may replace an existing object."""

    CREATE = "create"
    OVERWRITE = "overwrite"


@dataclass(frozen=True)
class TierCapabilities:
    """What a tier can do, declared (or probed) when it opens.

    Attributes:
        atomic_rename: ``rename_prefix`` exists and is atomic (POSIX directories).
        conditional_put: ``PutMode.CREATE`` is enforced atomically by the tier itself.
        object_lock: the tier can place a legal hold on objects.
        durable: objects survive a process crash and a power loss once ``put`` returns.
        persistent: objects survive the process (false for the memory tier).
    """

    atomic_rename: bool
    conditional_put: bool
    object_lock: bool
    durable: bool
    persistent: bool


@dataclass(frozen=True)
class ObjectInfo:
    """Metadata of one stored object.

    Attributes:
        key: the object's key.
        size: its size in bytes.
        mtime: when it was written (unix time), where the tier knows.
        etag: an opaque version stamp, where the tier knows one: it changes
            whenever the object is written again (two writes of the same bytes
            may or may not share one). ``None``: the tier cannot tell versions apart.
    """

    key: str
    size: int
    mtime: float | None = None
    etag: str | None = None


class Tier(abc.ABC):
    """Abstract base of every tier. See the module docstring for the contract.

    Args:
        name: the tier's name in the store configuration (``fast``, ``durable``, ...).
        domain: the failure domain this tier's bytes live in (node, rack, region).
    """

    def __init__(self, name: str, domain: str) -> None:
        self.name = name
        self.domain = domain

    @property
    @abc.abstractmethod
    def capabilities(self) -> TierCapabilities:
        """What this tier can do."""

    @abc.abstractmethod
    def location(self, prefix: str = "") -> str:
        """Human-readable location of ``prefix`` (a directory path or a URL)."""

    @abc.abstractmethod
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Store ``data`` under ``key``, all-or-nothing. Returns the stored object's info."""

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return bytes ``[start, end)`` of the object (``end=None``: to the end)."""

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` completely with the object's bytes starting at ``offset``.

        Lets a loader read straight into tensor memory, with no intermediate copy
        on tiers that can (POSIX ``preadv``). The default goes through ``get``.
        """
        data = self.get(key, offset, offset + out.nbytes)
        out.cast("B")[:] = data

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Return the object's info or raise :class:`ObjectNotFoundError`."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` names a complete object."""
        try:
            self.head(key)
        except ObjectNotFoundError:
            return False
        return True

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Yield, sorted, the keys of all objects whose key starts with ``prefix``.

        ``prefix`` is matched on whole path segments when it ends with ``/``,
        otherwise as a plain string prefix of the key.
        """

    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield, sorted by key, the info of every object ``list(prefix)`` yields.

        Each item carries the object's size and, where the tier knows one, its
        ``etag`` (the same as ``head`` gives). An object deleted while the listing
        runs may be left out; a listing that fails raises, never ends early.

        The default lists and then ``head``s each key: correct for any tier, one
        request per object. Tiers whose listing already returns sizes (S3's
        ListObjectsV2) override it. ``prefix`` is refused as ``list`` refuses it.
        """
        return self._head_each(self.list(prefix))

    def _head_each(self, keys: Iterator[str]) -> Iterator[ObjectInfo]:
        for key in keys:
            try:
                yield self.head(key)
            except ObjectNotFoundError:
                continue  # deleted since it was listed

    @abc.abstractmethod
    # ``builtins.list``: in the class body ``list`` names the method above.
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return, sorted, the names of the immediate "sub-directories" under ``prefix``.

        ``prefix`` is empty or ends with ``/``. A name is returned when at least one
        object lives below ``prefix + name + "/"``. (S3: ``CommonPrefixes``.)
        """

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""

    def rename_prefix(self, src: str, dst: str) -> None:  # noqa: ARG002 - the default refuses
        """Atomically move every object under ``src/`` to ``dst/`` (if ``atomic_rename``).

        Raises:
            ObjectExistsError: ``dst/`` already holds objects.
            ObjectNotFoundError: nothing exists under ``src/``.
            UnsupportedOperationError: the tier cannot rename atomically.
        """
        raise UnsupportedOperationError(f"tier {self.name!r} cannot rename atomically")

    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Attach advisory ``tags`` (e.g. ``{"importance": "critical"}``) to an object.

        The hint travels down to storage that can use it: extended attributes
        ``user.mouthguard.<tag>`` on POSIX, object tags on S3. It is advisory only;
        mouthguard's own policy is the guarantee. Returns whether the tier stored
        the tags (False where the tier or its filesystem cannot).
        """
        del key, tags  # a tier without annotations accepts and drops them
        return False

    def annotations(self, key: str) -> dict[str, str]:
        """The advisory tags stored on an object (empty where unsupported)."""
        del key
        return {}

    def set_legal_hold(self, key: str, on: bool) -> bool:
        """Place (or release) a storage-level legal hold on an object.

        Only tiers declaring ``object_lock`` can; the rest return False. Like
        annotations this backs up, never replaces, mouthguard's own holds.
        """
        del key, on
        return False

    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        """Remove the tier's own leftovers of interrupted writes under ``prefix``.

        A process killed inside ``put`` leaves tier-internal debris that ``list``
        never shows (temporary files on POSIX, abandoned multipart uploads on S3).
        Only debris older than ``older_than_seconds`` is removed, so writes still in
        flight in another process are safe. Returns how many items were removed.
        Tiers that cannot leave debris keep this default.
        """
        del prefix, older_than_seconds  # nothing to collect on a tier without debris
        return 0

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix`` (ending with ``/``); return how many."""
        count = 0
        for key in list(self.list(prefix)):
            if self.delete(key):
                count += 1
        return count

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, location={self.location()!r})"


#: Public methods of :class:`Tier` that describe the tier and reach no storage:
#: fault injection has nothing to inject into them.
_DESCRIPTIONS = frozenset({"location"})


def operations_of(cls: type) -> tuple[str, ...]:
    """The public methods ``cls`` itself defines, in the order it defines them.

    Properties are not methods (``capabilities`` is a declaration, not an
    operation), and neither are the names in :data:`_DESCRIPTIONS`.
    """
    return tuple(
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and callable(value) and name not in _DESCRIPTIONS
    )


#: Every operation of the tier interface, derived from :class:`Tier` itself so that
#: a method added to it is covered automatically by whatever iterates this: fault
#: injection (:data:`mouthguard.tiers.faults.OPS`), the conformance suite's
#: coverage check, and the harnesses that watch a tier's calls.
OPERATIONS: tuple[str, ...] = operations_of(Tier)


class StableChunks:
    """Put data whose chunks stay valid and unchanged until ``put`` returns.

    A plain iterable may reuse one buffer for every chunk it yields, so a tier
    must consume each chunk before asking for the next. Wrapping the chunks in
    ``StableChunks`` promises more: a tier may keep several chunks in flight at
    once and write straight from their memory, with no bounce copy (the async
    save's staging buffer is written this way).
    """

    def __init__(self, chunks: Iterable[BytesLike]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[BytesLike]:
        return iter(self._chunks)


def iter_buffers(data: PutData) -> Iterator[memoryview]:
    """Normalise ``PutData`` into a stream of byte-format memoryviews."""
    if isinstance(data, bytes | bytearray | memoryview):
        yield memoryview(data).cast("B")
        return
    for chunk in data:
        yield memoryview(chunk).cast("B")
