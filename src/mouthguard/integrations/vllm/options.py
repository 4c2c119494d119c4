"""The connector's options: ``kv_connector_extra_config`` read under KVStore's own names.

Pure (no vLLM, no torch): the same dictionary a user writes in ``KVTransferConfig`` or
``vllm serve --kv-transfer-config '{"kv_connector_extra_config": {...}}'`` becomes
the keyword arguments of :class:`mouthguard.kvcache.KVStore`, so nothing has two
names. Unknown keys are an error, not silently ignored: a misspelt ``disk_byte``
would otherwise run with no disk tier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mouthguard.errors import KVCacheError
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier

#: KVStore keyword -> the Python type its value must have.
STORE_OPTIONS: dict[str, type] = {
    "disk_dir": str,
    "memory_bytes": int,
    "disk_bytes": int,
    "block_tokens": int,
    "policy": str,
    "write_through": bool,
    "segment_bytes": int,
    "direct_io": bool,
    "staging_bytes": int,
    "on_full": str,
    "remote_bytes": int,
}
#: Options of the connector itself (not KVStore's).
CONNECTOR_OPTIONS: dict[str, type] = {
    "remote": str,  # a directory (a store path) or an s3:// URL: KVStore's remote tier
    "model_id": str,  # the namespace's model id (default: vLLM's model name)
}
#: Defaults that differ from KVStore's: an engine's host RAM is shared with its
#: own buffers, so the memory tier starts smaller than the library's 1 GiB.
DEFAULTS: dict[str, Any] = {"memory_bytes": 256 << 20}


@dataclass(frozen=True)
class ConnectorOptions:
    """What ``kv_connector_extra_config`` asked for.

    Attributes:
        store: keyword arguments for :class:`~mouthguard.kvcache.KVStore` (without
            ``namespace`` and ``remote``, which the connector adds).
        remote: the remote tier's location (a directory or ``s3://`` URL), or None.
        model_id: the namespace's model id, or None for the engine's model name.
    """

    store: dict[str, Any] = field(default_factory=dict)
    remote: str | None = None
    model_id: str | None = None


def parse_options(extra: Mapping[str, Any] | None) -> ConnectorOptions:
    """Check and split ``kv_connector_extra_config``.

    Raises:
        KVCacheError: an unknown key, or a value of the wrong type.
    """
    extra = dict(extra or {})
    known = STORE_OPTIONS | CONNECTOR_OPTIONS
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise KVCacheError(
            f"unknown mouthguard connector option(s) {unknown}; known: {sorted(known)}"
        )
    for name, value in extra.items():
        wanted = known[name]
        # bool is an int in Python: a size of True is a mistake, not 1 byte
        wrong = not isinstance(value, wanted) or (wanted is int and isinstance(value, bool))
        if wrong:
            raise KVCacheError(
                f"mouthguard connector option {name!r} must be {wanted.__name__}, got {value!r}"
            )
    store = DEFAULTS | {k: v for k, v in extra.items() if k in STORE_OPTIONS}
    return ConnectorOptions(store=store, remote=extra.get("remote"), model_id=extra.get("model_id"))


def rank_disk_dir(disk_dir: str, tp_rank: int, tp_size: int) -> str:
    """The disk directory of one tensor-parallel rank.

    Each rank holds its own heads in its own store, and a store locks its directory,
    so ranks beyond one get a subdirectory each; a single rank uses ``disk_dir``.
    """
    if tp_size == 1:
        return disk_dir
    return str(Path(disk_dir) / f"tp{tp_rank:03d}-of-{tp_size:03d}")


def open_remote(location: str) -> Tier:
    """The remote tier at ``location``: an ``s3://`` URL or a directory."""
    if location.startswith("s3://"):
        from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - obstore/boto3 only when used

        return S3Tier(location, name="kv-remote", domain="s3")
    path = Path(location)
    path.mkdir(parents=True, exist_ok=True)
    # transient blocks: no fsync (the KV store's importance), checksums catch the rest
    return LocalTier(path.resolve(), name="kv-remote", domain="local", durable=False)
