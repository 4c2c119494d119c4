"""Tiers: one narrow storage interface over RAM, POSIX directories and object stores.

Exported here: the interface (:class:`Tier` and its data types) and the argument
checks every tier applies, so that a tier written elsewhere rejects the same
keys and ranges with the same errors as mouthguard's own. Its conformance suite
is :mod:`mouthguard.testing.conformance`.
"""

from mouthguard.tiers.base import (
    OPERATIONS,
    BytesLike,
    ObjectInfo,
    PutData,
    PutMode,
    Tier,
    TierCapabilities,
    iter_buffers,
)
from mouthguard.tiers.object_keys import (
    join_key,
    validate_dir_prefix,
    validate_key,
    validate_prefix,
)
from mouthguard.tiers.ranges import check_range

__all__ = [
    "OPERATIONS",
    "BytesLike",
    "ObjectInfo",
    "PutData",
    "PutMode",
    "Tier",
    "TierCapabilities",
    "check_range",
    "iter_buffers",
    "join_key",
    "validate_dir_prefix",
    "validate_key",
    "validate_prefix",
]
