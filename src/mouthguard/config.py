"""Store configuration: ``mouthguard.toml`` or the embedded default directory.

Configuration form::

    [[tiers]]
    name = "fast"        # unique
    kind = "local"       # memory | local
    path = "/mnt/nvme/mouthguard"   # relative paths are relative to the toml file
    domain = "node-a"    # failure domain

The first tier listed is the fast tier: saves land there first.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from mouthguard.errors import ConfigError, InvalidKeyError
from mouthguard.tiers.keys import validate_segment

TIER_KINDS = ("memory", "local")


@dataclass(frozen=True)
class TierConfig:
    """One ``[[tiers]]`` entry."""

    name: str
    kind: str
    domain: str
    path: Path | None = None


@dataclass(frozen=True)
class StoreConfig:
    """A parsed store configuration."""

    source: str
    tiers: tuple[TierConfig, ...]


def default_config(directory: Path) -> StoreConfig:
    """The embedded default store: one local tier ``fast`` under ``directory``."""
    return StoreConfig(
        source=str(directory),
        tiers=(TierConfig(name="fast", kind="local", domain="local", path=directory / "fast"),),
    )


def load_config(path: Path) -> StoreConfig:
    """Parse a ``mouthguard.toml`` file.

    Raises:
        ConfigError: the file is missing, not TOML, or describes an invalid store.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"store configuration {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read store configuration {path}: {exc}") from None
    raw_tiers = data.get("tiers")
    if not isinstance(raw_tiers, list) or not raw_tiers:
        raise ConfigError(f"{path}: at least one [[tiers]] entry is required")
    tiers: list[TierConfig] = []
    for i, raw in enumerate(raw_tiers):
        tiers.append(_tier(raw, i, path.parent))
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: tier names must be unique, got {names}")
    return StoreConfig(source=str(path), tiers=tuple(tiers))


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
    path: Path | None = None
    if kind == "local":
        raw_path = raw.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise ConfigError(f"{where} ({name}): a local tier needs 'path'")
        path = Path(raw_path).expanduser()
        path = path if path.is_absolute() else base / path
    unknown = set(raw) - {"name", "kind", "domain", "path"}
    if unknown:
        raise ConfigError(f"{where} ({name}): unknown keys {sorted(unknown)}")
    return TierConfig(name=name, kind=str(kind), domain=domain, path=path)
