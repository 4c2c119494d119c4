"""Where a dataset lives: a tier and a key prefix, from a path, an ``s3://`` URL or a tier.

* a local directory path -> :class:`~mouthguard.tiers.local.LocalTier` rooted there;
* ``s3://bucket/prefix`` -> :class:`~mouthguard.tiers.s3.S3Tier` with the settings
  every S3 tier of the project reads from the environment (``AWS_ENDPOINT_URL_S3``
  or ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...; see
  :class:`~mouthguard.tiers.s3.S3Tier`);
* any :class:`~mouthguard.tiers.Tier` plus a key prefix.

A location built from a path or a URL remembers how it was opened
(:attr:`Location.spec`), so a process that did not open it (a DataLoader worker,
which may be forked or spawned) opens its own tier instead of using one whose
connections belong to its parent. Reading never creates anything: a path that
is not a directory is :class:`~mouthguard.errors.DatasetNotFoundError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from mouthguard.errors import DatasetNotFoundError
from mouthguard.tiers import Tier, join_key
from mouthguard.tiers.keys import validate_prefix
from mouthguard.tiers.local import LocalTier

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
    """

    tier: Tier = field(compare=False)
    prefix: str
    spec: Spec | None = None

    def key(self, *parts: str) -> str:
        """The tier key of ``parts`` under the prefix (validated)."""
        return join_key(self.prefix, *parts)

    def child(self, name: str) -> Location:
        """The location ``name`` below this one (a dataset in a directory of datasets)."""
        return replace(self, prefix=join_key(self.prefix, name))

    def describe(self) -> str:
        """A path or URL for messages."""
        return self.tier.location(self.prefix)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # A spawned worker unpickles a path or URL location by opening its own tier.
        if self.spec is None:
            return (Location, (self.tier, self.prefix, None))
        return (_reopen, (self.spec, self.prefix))

    def reopened(self) -> Location:
        """This location with a tier opened by the calling process (where the spec allows)."""
        if self.spec is None:
            return self
        return replace(self, tier=open_tier(self.spec, create=False))


def open_tier(spec: Spec, *, create: bool) -> Tier:
    """The tier a spec names.

    Raises:
        DatasetNotFoundError: a local directory is missing and ``create`` is false.
        TierError: the S3 bucket cannot be reached.
    """
    kind, where = spec
    if kind == "s3":
        from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - obstore/boto3 only when used

        return S3Tier(where, name="data", domain="s3")
    path = Path(where)
    if not create and not path.is_dir():
        raise DatasetNotFoundError(f"no dataset at {where}: not a directory")
    return LocalTier(path, name="data", domain="local")


def locate(target: Target, prefix: str = "", *, create: bool = False) -> Location:
    """The location of ``target`` (+ ``prefix``), opening its tier.

    Args:
        target: a directory path, an ``s3://bucket/prefix`` URL, or a tier.
        prefix: a key prefix inside it (``a/b``; default: the target itself).
        create: a writer may create a missing local directory; readers never do.
    """
    validate_prefix(prefix)
    prefix = prefix.rstrip("/")
    if isinstance(target, Tier):
        return Location(target, prefix)
    text = os.fspath(target)
    spec: Spec = ("s3", text) if text.startswith("s3://") else ("local", str(Path(text).resolve()))
    return Location(open_tier(spec, create=create), prefix, spec)


def _reopen(spec: Spec, prefix: str) -> Location:
    return Location(open_tier(spec, create=False), prefix, spec)
