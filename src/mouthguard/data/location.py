"""Where a dataset lives: a tier and a key prefix, from a path, an ``s3://`` URL or a tier.

* a local directory path -> :class:`~mouthguard.tiers.local.LocalTier` rooted there;
* ``s3://bucket/prefix`` -> :class:`~mouthguard.tiers.s3.S3Tier` with the settings
  every S3 tier of the project reads from the environment (``AWS_ENDPOINT_URL_S3``
  or ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...; see
  :class:`~mouthguard.tiers.s3.S3Tier`);
* any :class:`~mouthguard.tiers.Tier` plus a key prefix.

A location built from a path or a URL remembers how it was opened
(:attr:`Location.spec`), so a process that did not open it (a DataLoader worker)
opens its own tier instead of using one whose connections belong to its parent.
A spawned worker does so as it unpickles the location; a forked one when it
first reads. Either skips the S3 bucket check the opening process made
(:func:`open_tier`, ``check``): one request and one client fewer per worker and
epoch. A spawned worker's S3 tier is made when first used
(:class:`LazyTier`): a worker whose epoch finds every shard in the cache makes
no S3 client at all. The S3 client (obstore, on a tokio runtime) does not survive
``fork`` at all -- a forked child that touches it hangs, even with a new
client -- so an S3 location inherited across a fork is refused with an
explanation (:meth:`Location.reopened`) instead of hanging; DataLoader workers
for S3 datasets come from a fork server or are spawned
(:class:`~mouthguard.data.loading.loader.StreamingDataLoader` uses the fork server by
itself). Reading never creates anything: a path that is not a
directory is :class:`~mouthguard.errors.DatasetNotFoundError`.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from mouthguard.errors import DatasetError, DatasetNotFoundError
from mouthguard.tiers import Tier, join_key
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.object_keys import validate_prefix
from mouthguard.tiers.wrapper import WrappedTier

#: What a path or URL source was: ("local", path) or ("s3", url).
Spec = tuple[str, str]
#: What the public functions accept as a place.
Target = str | os.PathLike[str] | Tier


@dataclass(frozen=True)
class Location:
    """A dataset's place: ``tier`` and ``prefix`` (no trailing ``/``; ``""`` is the root).

    Attributes:
        spec: how to open the tier again in another process (None for a tier the
            caller passed in, which is then used as it is).
        pid: the process that opened ``tier``.
    """

    tier: Tier = field(compare=False)
    prefix: str
    spec: Spec | None = None
    pid: int = field(default_factory=os.getpid, compare=False)

    def key(self, *parts: str) -> str:
        """The tier key of ``parts`` under the prefix (validated)."""
        return join_key(self.prefix, *parts)

    def child(self, name: str) -> Location:
        """The location ``name`` below this one (a dataset in a directory of datasets)."""
        return replace(self, prefix=join_key(self.prefix, name))

    def describe(self) -> str:
        """A path or URL for messages."""
        return self.tier.location(self.prefix)

    @property
    def fork_safe(self) -> bool:
        """Whether a forked child may use this location (false for S3: see the module doc)."""
        if self.spec is not None:
            return self.spec[0] != "s3"
        s3 = sys.modules.get("mouthguard.tiers.s3")  # loaded if an S3 tier exists at all
        return s3 is None or not isinstance(self.tier, s3.S3Tier)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # A spawned worker unpickles a path or URL location by opening its own tier.
        if self.spec is None:
            return (Location, (self.tier, self.prefix, None, os.getpid()))
        return (_reopen, (self.spec, self.prefix))

    def reopened(self) -> Location:
        """This location with a tier that belongs to the calling process.

        Raises:
            DatasetError: an S3 location inherited across a fork (see the module doc).
        """
        if self.pid == os.getpid():
            return self
        if not self.fork_safe:
            raise DatasetError(
                f"{self.describe()} was opened by process {self.pid} and inherited by fork; "
                "the S3 client cannot be used after a fork (it would hang): start DataLoader "
                "workers with multiprocessing_context='forkserver' or 'spawn' "
                "(StreamingDataLoader uses the fork server), "
                "and pass the s3:// URL rather than a tier object"
            )
        if self.spec is None:
            return self
        return replace(self, tier=open_tier(self.spec, create=False, check=False), pid=os.getpid())


def open_tier(spec: Spec, *, create: bool, write: bool = False, check: bool = True) -> Tier:
    """The tier a spec names; an S3 one read-only unless ``create`` or ``write``.

    ``check=False``: a process reopening what another opened (a DataLoader
    worker) skips the S3 bucket check -- a request and a client per worker per
    epoch -- that the opener made moments before; a bucket gone since fails
    the worker's first read with that read's error.

    Raises:
        DatasetNotFoundError: a local directory is missing and ``create`` is false.
        TierError: the S3 bucket cannot be reached (checked: at open; else at the first request).
    """
    kind, where = spec
    if kind == "s3":
        from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - obstore/boto3 only when used

        # A reader opens it read-only: nothing is written to the bucket at open (no
        # probe objects, from every DataLoader worker of every epoch), and read-only
        # credentials are enough to stream a dataset.
        read_only = not (create or write)
        return S3Tier(where, name="data", domain="s3", read_only=read_only, check_bucket=check)
    path = Path(where)
    if not create and not path.is_dir():
        raise DatasetNotFoundError(f"no dataset at {where}: not a directory")
    return LocalTier(path, name="data", domain="local")


def locate(
    target: Target, prefix: str = "", *, create: bool = False, write: bool = False
) -> Location:
    """The location of ``target`` (+ ``prefix``), opening its tier.

    Args:
        target: a directory path, an ``s3://bucket/prefix`` URL, or a tier.
        prefix: a key prefix inside it (``a/b``; default: the target itself).
        create: a writer may create a missing local directory; readers never do.
        write: the caller writes or deletes there (``create`` implies it); without
            either, an S3 tier opened from a URL is read-only.
    """
    validate_prefix(prefix)
    prefix = prefix.rstrip("/")
    if isinstance(target, Tier):
        return Location(target, prefix)
    text = os.fspath(target)
    spec: Spec = ("s3", text) if text.startswith("s3://") else ("local", str(Path(text).resolve()))
    return Location(open_tier(spec, create=create, write=write), prefix, spec)


class LazyTier(WrappedTier):
    """The tier of an S3 spec, opened (unchecked) by the first operation that needs it.

    For a location unpickled in a DataLoader worker: making the S3 clients costs
    about 17-20 ms of CPU per worker and epoch (measured on the 2-core
    development machine), spent before the worker's first sample even when
    every shard it reads is in the cache already. Name and failure domain are
    those :func:`open_tier` gives. Thread-safe: the worker's index and range
    threads may ask at once; one opens, the others wait for it.
    """

    def __init__(self, spec: Spec) -> None:
        Tier.__init__(self, "data", spec[0])  # not WrappedTier's: nothing to wrap yet
        self._spec = spec
        self._opened: Tier | None = None
        self._lock = threading.Lock()

    @property
    def inner(self) -> Tier:  # type: ignore[override]  # WrappedTier's attribute, made on demand
        """The tier, opened on first use."""
        opened = self._opened
        if opened is None:
            with self._lock:
                if self._opened is None:
                    self._opened = open_tier(self._spec, create=False, check=False)
                opened = self._opened
        return opened


def _reopen(spec: Spec, prefix: str) -> Location:
    # Unpickled in a worker: the process that pickled the location opened (and checked)
    # it; an S3 tier is opened when the worker first needs it (see LazyTier).
    tier = LazyTier(spec) if spec[0] == "s3" else open_tier(spec, create=False)
    return Location(tier, prefix, spec)
