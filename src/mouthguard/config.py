"""Store configuration: ``mouthguard.toml`` or the embedded default directory.

Configuration form::

    [[tiers]]
    name = "fast"        # unique
    kind = "local"       # memory | local | s3
    path = "/mnt/nvme/mouthguard"   # relative paths are relative to the toml file
    domain = "node-a"    # failure domain

    [[tiers]]
    name = "s3"
    kind = "s3"
    url = "s3://bucket/prefix"
    endpoint = "http://127.0.0.1:9000"   # optional; credentials from AWS_* variables
    region = "us-east-1"                 # optional
    domain = "region-a"

    [[tiers]]
    name = "remote"
    kind = "s3"
    url = "s3://bucket/encrypted"
    encryption_key_env = "MOUTHGUARD_S3_KEY"   # optional, any kind: client-side AES-256-GCM

    [policy]                 # optional: overrides of the importance policy
    trash_delay_seconds = 86400
    [policy.routine]
    keep_last = 5

    [kvcache]                # optional: the vLLM KV connector's options
    disk_dir = "kv"          # KVStore's own names; relative paths as for tiers
    disk_bytes = 107374182400
    remote = "s3://bucket/kv"

The first tier listed is the fast tier: saves land there first. A file read only
for its ``[kvcache]`` table (:func:`load_kvcache_table`) needs no ``[[tiers]]``.

``encryption_key_env`` names an environment variable holding the tier's
encryption keys (``[ID=]KEY[,...]``, 32-byte keys in hex or base64, the first one
encrypting; :mod:`mouthguard.tiers.key_material`): the tier is then wrapped in an
:class:`~mouthguard.tiers.encrypted.EncryptedTier`. The key itself never appears
in the configuration file.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from mouthguard.errors import ConfigError, InvalidKeyError
from mouthguard.policy.config import PolicyConfig
from mouthguard.tiers.object_keys import validate_segment

TIER_KINDS = ("memory", "local", "s3")
_COMMON_KEYS = {"name", "kind", "domain", "encryption_key_env"}
_TIER_KEYS = {
    "memory": _COMMON_KEYS,
    "local": _COMMON_KEYS | {"path"},
    "s3": _COMMON_KEYS | {"url", "endpoint", "region"},
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The KV connector's table, and its keys that name a directory (a relative one is
#: relative to the file; ``remote`` may also be an ``s3://`` URL, kept as written).
KVCACHE_TABLE = "kvcache"
_KVCACHE_PATHS = ("disk_dir", "remote")


@dataclass(frozen=True)
class TierConfig:
    """One ``[[tiers]]`` entry."""

    name: str
    kind: str
    domain: str
    path: Path | None = None
    url: str | None = None
    endpoint: str | None = None
    region: str | None = None
    #: The environment variable with the tier's encryption keys (None: not encrypted).
    encryption_key_env: str | None = None


@dataclass(frozen=True)
class StoreConfig:
    """A parsed store configuration."""

    source: str
    tiers: tuple[TierConfig, ...]
    policy: PolicyConfig = field(default_factory=PolicyConfig)


def default_config(directory: Path) -> StoreConfig:
    """The embedded default store: local tiers ``fast`` and ``durable`` under ``directory``.

    They are declared in distinct failure domains so that the importance policy
    (two copies in distinct domains for routine and above) can be met and seen
    working out of the box. They share one disk: the second copy protects against
    a damaged or deleted copy, not against losing the disk. Real deployments list
    their tiers (NVMe, parallel FS, object store) in a ``mouthguard.toml``.
    """
    return StoreConfig(
        source=str(directory),
        tiers=(
            TierConfig(name="fast", kind="local", domain="local-fast", path=directory / "fast"),
            TierConfig(
                name="durable", kind="local", domain="local-durable", path=directory / "durable"
            ),
        ),
    )


def _read_toml(path: Path) -> dict[str, object]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"store configuration {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read store configuration {path}: {exc}") from None


def load_kvcache_table(path: Path) -> dict[str, object]:
    """The ``[kvcache]`` table of a ``mouthguard.toml`` (empty when the file has none).

    Its keys are not checked here (the connector that reads them knows its own
    options); ``disk_dir`` and a ``remote`` that is not an ``s3://`` URL, when
    relative, become absolute against the file's directory, as tier paths do.

    Raises:
        ConfigError: the file is missing or not TOML, or ``kvcache`` is not a table.
    """
    table = _read_toml(path).get(KVCACHE_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{KVCACHE_TABLE}] must be a table")
    out = dict(table)
    for key in _KVCACHE_PATHS:
        value = out.get(key)
        if isinstance(value, str) and value and not value.startswith("s3://"):
            directory = Path(value).expanduser()
            out[key] = str(directory if directory.is_absolute() else path.parent / directory)
    return out


def load_config(path: Path) -> StoreConfig:
    """Parse a ``mouthguard.toml`` file.

    Raises:
        ConfigError: the file is missing, not TOML, or describes an invalid store.
    """
    data = _read_toml(path)
    raw_tiers = data.get("tiers")
    if not isinstance(raw_tiers, list) or not raw_tiers:
        raise ConfigError(f"{path}: at least one [[tiers]] entry is required")
    tiers: list[TierConfig] = []
    for i, raw in enumerate(raw_tiers):
        tiers.append(_tier(raw, i, path.parent))
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: tier names must be unique, got {names}")
    unknown = set(data) - {"tiers", "policy", KVCACHE_TABLE}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(unknown)}")
    raw_policy = data.get("policy", {})
    if not isinstance(raw_policy, dict):
        raise ConfigError(f"{path}: [policy] must be a table")
    policy = PolicyConfig.from_toml(raw_policy)
    return StoreConfig(source=str(path), tiers=tuple(tiers), policy=policy)


def _tier(raw: object, index: int, base: Path) -> TierConfig:
    where = f"tiers[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    name, kind = raw.get("name"), raw.get("kind")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: 'name' is required and must be a string")
    try:
        validate_segment(name)
    except InvalidKeyError:
        raise ConfigError(f"{where}: invalid tier name {name!r}") from None
    if kind not in TIER_KINDS:
        raise ConfigError(
            f"{where} ({name}): unknown kind {kind!r}; supported: {', '.join(TIER_KINDS)}"
        )
    domain = raw.get("domain", name)
    if not isinstance(domain, str) or not domain:
        raise ConfigError(f"{where} ({name}): 'domain' must be a non-empty string")
    unknown = set(raw) - _TIER_KEYS[str(kind)]
    if unknown:
        raise ConfigError(f"{where} ({name}): unknown keys {sorted(unknown)} for a {kind} tier")
    path: Path | None = None
    if kind == "local":
        raw_path = raw.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise ConfigError(f"{where} ({name}): a local tier needs 'path'")
        path = Path(raw_path).expanduser()
        path = path if path.is_absolute() else base / path
    strings = {k: raw.get(k) for k in ("url", "endpoint", "region")}
    for key, value in strings.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where} ({name}): '{key}' must be a non-empty string")
    key_env = raw.get("encryption_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env)):
        raise ConfigError(
            f"{where} ({name}): 'encryption_key_env' must name an environment variable"
        )
    url = strings["url"]
    if kind == "s3" and (not isinstance(url, str) or not url.startswith("s3://")):
        raise ConfigError(f'{where} ({name}): an s3 tier needs url = "s3://bucket/prefix"')
    return TierConfig(
        name=name,
        kind=str(kind),
        domain=domain,
        path=path,
        url=url if isinstance(url, str) else None,
        endpoint=strings["endpoint"] if isinstance(strings["endpoint"], str) else None,
        region=strings["region"] if isinstance(strings["region"], str) else None,
        encryption_key_env=key_env,
    )
