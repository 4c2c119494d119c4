"""A store: the ordered tiers a checkpointer writes to and reads from, and who listens.

Listeners: a store hands its checkpointers (and the DCP writer) the
:class:`~mouthguard.checkpoint.listeners.CheckpointListener` that hears of their
saves and commits -- in practice the background replication service of
``mouthguard.jobs``, which this layer must not import. A store made with
``listener=`` uses that factory; every other store uses the process-wide
default, which ``mouthguard/wiring.py`` installs with
:func:`install_default_listener` when the package is imported (Python runs
``mouthguard/__init__.py`` before any submodule, so no store is ever made
before it). Without either, saves and loads simply tell no one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from mouthguard.checkpoint.listeners import CheckpointListener
from mouthguard.config import StoreConfig, TierConfig, default_config, load_config
from mouthguard.errors import ConfigError
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.policy.config import PolicyConfig
from mouthguard.tiers.base import Tier
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier

#: Makes (or finds) the listener of a store. Called on every use, so it must be
#: cheap and return the same listener for the same store while it lives.
ListenerFactory = Callable[["Store"], CheckpointListener]

_default_listener: ListenerFactory | None = None


def install_default_listener(factory: ListenerFactory | None) -> ListenerFactory | None:
    """Make ``factory`` the listener of every store made without one; return the previous.

    ``None`` removes the default (stores then tell no one). Called once by the
    package's composition root (``mouthguard/wiring.py``); tests swap it and
    restore the previous one.
    """
    global _default_listener
    previous, _default_listener = _default_listener, factory
    return previous


class Store:
    """Ordered tiers; the first one is the fast tier.

    Args:
        tiers: the tiers, fast first. Names must be unique.
        source: where the configuration came from (a directory or a toml path).
        policy: the importance policy (``[policy]`` of the configuration).
        manifest_keys: manifest signing keys for the store's checkpointers
            (:mod:`mouthguard.format.signing`); None: each ``Checkpointer`` looks
            at ``$MOUTHGUARD_MANIFEST_KEY`` itself.
        listener: makes the listener of this store's saves and commits (see the
            module docstring); None: the process-wide default.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        source: str = "",
        policy: PolicyConfig | None = None,
        manifest_keys: Keyring | None = None,
        listener: ListenerFactory | None = None,
    ) -> None:
        if not tiers:
            raise ConfigError("a store needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tier names must be unique, got {names}")
        self.tiers: tuple[Tier, ...] = tuple(tiers)
        self.source = source
        self.policy = policy or PolicyConfig()
        self.manifest_keys = manifest_keys
        self._listener = listener

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

    def listener(self) -> CheckpointListener | None:
        """The listener of this store's saves and commits (None: nobody listens).

        Asked on every use rather than once, so a listener that starts work (the
        background service starts its thread) does so only when something happens.
        """
        factory = self._listener or _default_listener
        return None if factory is None else factory(self)

    def __repr__(self) -> str:
        return f"Store(source={self.source!r}, tiers={[t.name for t in self.tiers]})"


def _build_tier(config: TierConfig) -> Tier:
    tier = _open_tier(config)
    if config.encryption_key_env is None:
        return tier
    from mouthguard.tiers.encrypted import encrypted_from_env  # noqa: PLC0415 - cryptography when used

    return encrypted_from_env(tier, config.encryption_key_env)


def _open_tier(config: TierConfig) -> Tier:
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


def store_from_config(config: StoreConfig, manifest_keys: Keyring | None = None) -> Store:
    """Open every tier of ``config``."""
    tiers = [_build_tier(t) for t in config.tiers]
    return Store(tiers, source=config.source, policy=config.policy, manifest_keys=manifest_keys)


def open_store(
    path: str | os.PathLike[str], *, create: bool = True, signing_key: KeySpec | None = None
) -> Store:
    """Open a store from a directory (the embedded default) or a ``mouthguard.toml`` file.

    Args:
        path: a directory, created if missing when ``create``; or a ``.toml`` file.
        create: create the embedded default store (the directory and its tier
            directories) where there is none. Without it, a directory that holds
            none of the tier directories is refused rather than turned into a
            store: reading (``mouthguard ls``) never writes.
        signing_key: manifest signing keys (:mod:`mouthguard.format.signing`);
            default ``$MOUTHGUARD_MANIFEST_KEY`` if set.

    Raises:
        ConfigError: the path is neither a usable directory nor a valid configuration.
    """
    target = Path(path).expanduser()
    keys = manifest_keys(signing_key) if signing_key is not None else keys_from_env()
    if target.suffix == ".toml" or target.is_file():
        return store_from_config(load_config(target), keys)
    if not target.exists():
        if not create:
            raise ConfigError(f"no store at {target}")
        target.mkdir(parents=True, exist_ok=True)
    elif not target.is_dir():
        raise ConfigError(f"{target} is neither a directory nor a mouthguard.toml file")
    config = default_config(target.resolve())
    if not create and not any(t.path is not None and t.path.is_dir() for t in config.tiers):
        names = " or ".join(f"{t.name}/" for t in config.tiers)
        raise ConfigError(f"no store at {target} (a store directory holds {names})")
    return store_from_config(config, keys)
