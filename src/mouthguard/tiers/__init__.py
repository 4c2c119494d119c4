"""Tiers: one narrow storage interface over RAM, POSIX directories and object stores."""

from mouthguard.tiers.base import (
    BytesLike,
    ObjectInfo,
    PutData,
    PutMode,
    Tier,
    TierCapabilities,
    iter_buffers,
)
from mouthguard.tiers.object_keys import join_key, validate_key

__all__ = [
    "BytesLike",
    "ObjectInfo",
    "PutData",
    "PutMode",
    "Tier",
    "TierCapabilities",
    "iter_buffers",
    "join_key",
    "validate_key",
]
