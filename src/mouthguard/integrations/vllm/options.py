"""The connector's options: ``kv_connector_extra_config`` read under KVStore's own names.

Pure (no vLLM, no torch): the same dictionary a user writes in ``KVTransferConfig`` or
``vllm serve --kv-transfer-config '{"kv_connector_extra_config": {...}}'`` becomes
the keyword arguments of :class:`mouthguard.kvcache.KVStore`, so nothing has two
names. Unknown keys are an error, not silently ignored: a misspelt ``disk_byte``
would otherwise run with no disk tier.

The same options may come from the ``[kvcache]`` table of a ``mouthguard.toml``
(:func:`mouthguard.config.load_kvcache_table`): the file named by the extra config's
``config`` key, else by ``$MOUTHGUARD_CONFIG``. There is no lookup in the working
directory (an engine's is arbitrary). A key given in the extra config wins over
the file's, so one engine can override a fleet-wide file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mouthguard.config import load_kvcache_table
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
    "async_load": bool,  # load on a worker thread while the request waits (default False)
}
#: The extra-config key naming a mouthguard.toml, and the variable used without it.
CONFIG_KEY = "config"
CONFIG_ENV = "MOUTHGUARD_CONFIG"
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
        config_file: the mouthguard.toml whose ``[kvcache]`` table was read, or None.
        async_load: the scheduler returns ``load_kv_async=True`` and the worker fills
            the pages on a background thread while the request waits (see
            :mod:`mouthguard.integrations.vllm.loading`); False loads inside the forward.
    """

    store: dict[str, Any] = field(default_factory=dict)
    remote: str | None = None
    model_id: str | None = None
    config_file: str | None = None
    async_load: bool = False


def parse_options(
    extra: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> ConnectorOptions:
    """Check and split ``kv_connector_extra_config``, over a mouthguard.toml's ``[kvcache]``.

    Args:
        extra: the extra config; its ``config`` key names a mouthguard.toml.
        environ: where ``$MOUTHGUARD_CONFIG`` is looked up (default ``os.environ``).

    Raises:
        KVCacheError: an unknown key, or a value of the wrong type (in the file or
            the extra config; the message says which).
        ConfigError: the named file is missing or not TOML.
    """
    extra = dict(extra or {})
    config_file = extra.pop(CONFIG_KEY, None)
    if config_file is not None and (not isinstance(config_file, str) or not config_file):
        raise KVCacheError(f"mouthguard connector option {CONFIG_KEY!r} must name a file")
    config_file = config_file or (os.environ if environ is None else environ).get(CONFIG_ENV)
    from_file: dict[str, Any] = {}
    if config_file:
        from_file = load_kvcache_table(Path(config_file))
        _check(from_file, f"[kvcache] of {config_file}")
    _check(extra, "kv_connector_extra_config")
    merged = from_file | extra  # the engine's own keys override the shared file
    store = DEFAULTS | {k: v for k, v in merged.items() if k in STORE_OPTIONS}
    return ConnectorOptions(
        store=store,
        remote=merged.get("remote"),
        model_id=merged.get("model_id"),
        config_file=config_file or None,
        async_load=merged.get("async_load", False),
    )


def _check(options: Mapping[str, Any], where: str) -> None:
    """Every key known and every value of its type; ``where`` names the source."""
    known = STORE_OPTIONS | CONNECTOR_OPTIONS
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise KVCacheError(
            f"unknown mouthguard connector option(s) {unknown} in {where}; known: "
            f"{sorted(known | {CONFIG_KEY: str})}"
        )
    for name, value in options.items():
        wanted = known[name]
        # bool is an int in Python: a size of True is a mistake, not 1 byte
        wrong = not isinstance(value, wanted) or (wanted is int and isinstance(value, bool))
        if wrong:
            raise KVCacheError(
                f"mouthguard connector option {name!r} in {where} must be "
                f"{wanted.__name__}, got {value!r}"
            )


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
