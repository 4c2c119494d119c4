"""A store: the ordered tiers a checkpointer writes to and reads from."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mouthguard.config import StoreConfig, TierConfig, default_config, load_config
from mouthguard.errors import ConfigError
from mouthguard.policy.config import PolicyConfig
from mouthguard.tiers.base import Tier
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier


class Store:
    """Ordered tiers; the first one is the fast tier.

    Args:
        tiers: the tiers, fast first. Names must be unique.
        source: where the configuration came from (a directory or a toml path).
        policy: the importance policy (``[policy]`` of the configuration).
    """

    def __init__(
        self, tiers: Sequence[Tier], *, source: str = "", policy: PolicyConfig | None = None
    ) -> None:
        if not tiers:
            raise ConfigError("a store needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tier names must be unique, got {names}")
        self.tiers: tuple[Tier, ...] = tuple(tiers)
        self.source = source
        self.policy = policy or PolicyConfig()

    @property
    def fast(self) -> Tier:
        """The fast tier (first configured)."""
        return self.tiers[0]

    def tier(self, name: str) -> Tier:
        """The tier called ``name``."""
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"Store(source={self.source!r}, tiers={[t.name for t in self.tiers]})"


def _build_tier(config: TierConfig) -> Tier:
    if config.kind == "memory":
        return MemoryTier(name=config.name, domain=config.domain)
    if config.kind == "s3":
        from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - obstore/boto3 only when used

        assert config.url is not None
        return S3Tier(
            config.url,
            name=config.name,
            domain=config.domain,
            endpoint=config.endpoint,
            region=config.region,
        )
    assert config.path is not None
    return LocalTier(config.path, name=config.name, domain=config.domain)


def store_from_config(config: StoreConfig) -> Store:
    """Open every tier of ``config``."""
    tiers = [_build_tier(t) for t in config.tiers]
    return Store(tiers, source=config.source, policy=config.policy)


def open_store(path: str | os.PathLike[str], *, create: bool = True) -> Store:
    """Open a store from a directory (the embedded default) or a ``mouthguard.toml`` file.

    Args:
        path: a directory, created if missing when ``create``; or a ``.toml`` file.
        create: create the embedded default directory if it does not exist.

    Raises:
        ConfigError: the path is neither a usable directory nor a valid configuration.
    """
    target = Path(path).expanduser()
    if target.suffix == ".toml" or target.is_file():
        return store_from_config(load_config(target))
    if not target.exists():
        if not create:
            raise ConfigError(f"no store at {target}")
        target.mkdir(parents=True, exist_ok=True)
    elif not target.is_dir():
        raise ConfigError(f"{target} is neither a directory nor a mouthguard.toml file")
    return store_from_config(default_config(target.resolve()))
