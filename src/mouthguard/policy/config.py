"""Policy configuration: what each importance level is owed, and the retention knobs.

The defaults, level by level:

============  ==================================================================
level         default protection
============  ==================================================================
critical      a copy on every durable tier besides the fast tier (so >= 3 where
              three are configured; ``min_copies = 3`` demands it), at least 2
              in distinct failure domains, each read-back verified; legal hold
              where a tier supports it; never auto-deleted; pinned on the fast
              tier while it is the newest critical of its run
milestone     >= 2 copies in distinct failure domains, verified; all kept
              (``keep_last`` limits it to the last N milestones of a run)
routine       >= 2 copies in distinct failure domains (RF2 minimum); keep the
              last 3 of a run
transient     one copy, fast tier only; keep the last 1 of a run; trash
              delay 0 (purged on the pass after it is trashed)
============  ==================================================================

Durability is the tier's, not the level's: a save is on stable storage when it
is acknowledged exactly when its tier is durable (a local tier fsyncs the file
and its directory, at every level, transient included). Which checkpoints stay
on the fast tier is ``fast_keep_newest``'s decision (plus the newest critical of
each run). The former per-level keys ``fsync`` and ``keep_on_fast`` changed
neither; they are refused with a message saying so.

``[policy]`` in ``mouthguard.toml`` overrides them::

    [policy]
    trash_delay_seconds = 3600
    keep_within_seconds = 7200  # keep everything younger than 2 h (default: off)
    fast_keep_newest = 2
    best_metric = "loss"
    best_mode = "min"          # or "max"
    best_k = 2
    max_delete_share = 0.5     # one cleanup pass starts deleting at most half a run

    [policy.routine]
    keep_last = 5
    min_copies = 2

    [policy.milestone]
    keep_last = 10             # or "all" (the default)

``golden`` is accepted as a section name for ``critical``. Unknown keys, wrong
types and values that would weaken a guarantee below the floor (fewer than
2 copies above transient, a keep-last limit on critical, negative delays)
raise :class:`~mouthguard.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from mouthguard.errors import ConfigError
from mouthguard.policy.importance import Importance

BestMode = Literal["min", "max"]

DAY = 86400.0

#: Default share of a run's (non-transient) checkpoints one retention pass may
#: start deleting (:mod:`mouthguard.policy.blast_radius`).
DEFAULT_MAX_DELETE_SHARE = 0.5


def check_max_share(value: object) -> float:
    """Return ``value`` if it is a share in (0, 1], else raise ValueError."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ValueError(f"max delete share must be a number in (0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LevelPolicy:
    """What one importance level is owed.

    Attributes:
        min_copies: replicas required on durable tiers (1 for transient, whose
            single copy lives on the fast tier).
        distinct_domains: the replicas must span ``min_copies`` failure domains.
        verify_before_counting: a replica counts only once read back and verified.
        all_durable_tiers: in addition, every durable tier other than the fast
            tier holds a copy (the fast copy is held only while pinned there).
        legal_hold: place a legal hold on tiers that support object lock.
        fast_only: the one copy lives on the fast tier only (transient).
        keep_last: keep the last N valid checkpoints of this level per run;
            ``None`` keeps them all.
        never_auto_delete: retention never drops it (critical).
        trash_delay_seconds: delay between trash and purge for this level;
            ``None`` uses :attr:`PolicyConfig.trash_delay_seconds`.
    """

    min_copies: int
    distinct_domains: bool
    verify_before_counting: bool
    all_durable_tiers: bool = False
    legal_hold: bool = False
    fast_only: bool = False
    keep_last: int | None = None
    never_auto_delete: bool = False
    trash_delay_seconds: float | None = None


def default_levels() -> dict[Importance, LevelPolicy]:
    """The module doc's table as :class:`LevelPolicy` values (a fresh dict)."""
    return {
        Importance.CRITICAL: LevelPolicy(
            min_copies=2,
            distinct_domains=True,
            verify_before_counting=True,
            all_durable_tiers=True,
            legal_hold=True,
            never_auto_delete=True,
        ),
        Importance.MILESTONE: LevelPolicy(
            min_copies=2, distinct_domains=True, verify_before_counting=True
        ),
        Importance.ROUTINE: LevelPolicy(
            # Routine is owed RF2, not read-back verification; the deletion
            # rules still demand a verified copy before anything goes.
            min_copies=2,
            distinct_domains=True,
            verify_before_counting=False,
            keep_last=3,
        ),
        Importance.TRANSIENT: LevelPolicy(
            min_copies=1,
            distinct_domains=False,
            verify_before_counting=False,
            fast_only=True,
            keep_last=1,
            # Scratch is worth less than the fast-tier space it holds; the mark is
            # still written first, so purge happens on the next pass, never blind.
            trash_delay_seconds=0.0,
        ),
    }


@dataclass(frozen=True)
class PolicyConfig:
    """The whole policy configuration. Construct directly or with :meth:`from_toml`.

    Attributes:
        levels: one :class:`LevelPolicy` per importance; missing levels get the
            defaults. Stored read-only.
        trash_delay_seconds: time a trashed copy waits before it may be purged.
        fast_keep_newest: the newest N valid checkpoints of each run stay pinned
            on the fast tier (levels above transient).
        best_metric: keep the best checkpoints by this metric (``None``: off).
        best_mode: ``"min"`` (lower is better, e.g. loss) or ``"max"``.
        best_k: how many best checkpoints per run to keep (0: off).
        keep_within_seconds: keep every valid checkpoint above transient created
            less than this long before ``now`` (restic's ``--keep-within``);
            ``None``: off.
        max_delete_share: the blast-radius limit: one retention pass refuses to
            start deleting more than this share of a run's checkpoints above
            transient, or any milestone, unless forced
            (:mod:`mouthguard.policy.blast_radius`). In (0, 1].

    Raises:
        ConfigError: a value is impossible or weakens a guarantee (see module doc).
    """

    levels: Mapping[Importance, LevelPolicy] = field(default_factory=default_levels)
    trash_delay_seconds: float = DAY
    fast_keep_newest: int = 2
    best_metric: str | None = None
    best_mode: BestMode = "min"
    best_k: int = 1
    keep_within_seconds: float | None = None
    max_delete_share: float = DEFAULT_MAX_DELETE_SHARE

    def __post_init__(self) -> None:
        merged = default_levels()
        merged.update(self.levels)
        object.__setattr__(self, "levels", MappingProxyType(merged))
        _check_delay("policy.trash_delay_seconds", self.trash_delay_seconds)
        _check_count("policy.fast_keep_newest", self.fast_keep_newest, 0)
        _check_count("policy.best_k", self.best_k, 0)
        if self.best_mode not in ("min", "max"):
            raise ConfigError(f"policy.best_mode: must be 'min' or 'max', got {self.best_mode!r}")
        if self.keep_within_seconds is not None:
            _check_delay("policy.keep_within_seconds", self.keep_within_seconds)
        try:
            check_max_share(self.max_delete_share)
        except ValueError as exc:
            raise ConfigError(f"policy.max_delete_share: {exc}") from None
        if self.best_metric is not None and not self.best_metric:
            raise ConfigError("policy.best_metric: must be a non-empty string")
        for importance, level in merged.items():
            _check_level(importance, level)

    def level(self, importance: Importance) -> LevelPolicy:
        """The policy of ``importance``."""
        return self.levels[importance]

    def trash_delay(self, importance: Importance) -> float:
        """Seconds a trashed copy of an ``importance`` checkpoint waits before purge."""
        own = self.levels[importance].trash_delay_seconds
        return self.trash_delay_seconds if own is None else own

    @classmethod
    def from_toml(cls, table: Mapping[str, object]) -> PolicyConfig:
        """Build a configuration from the ``[policy]`` table of a ``mouthguard.toml``.

        Args:
            table: the parsed ``[policy]`` table (not the whole document; see
                :meth:`from_document`).

        Raises:
            ConfigError: unknown key, wrong type or impossible value; the message
                names the key (``policy.routine.min_copies: ...``).
        """
        if not isinstance(table, Mapping):
            raise ConfigError("policy: must be a table")
        levels = default_levels()
        top = cls()  # the defaults, replaced key by key below
        seen_levels: dict[Importance, str] = {}
        for key, value in table.items():
            if key in _LEVEL_SECTIONS:
                importance = _LEVEL_SECTIONS[key]
                if importance in seen_levels:
                    raise ConfigError(
                        f"policy.{key}: {importance.value} is configured twice "
                        f"(as [policy.{seen_levels[importance]}] and [policy.{key}])"
                    )
                seen_levels[importance] = key
                levels[importance] = _parse_level(key, importance, value, levels[importance])
            else:
                top = _set_top(top, key, value)
        if "best_metric" not in table:
            for key in ("best_mode", "best_k"):
                if key in table:
                    raise ConfigError(f"policy.{key}: set without policy.best_metric")
        return replace(top, levels=levels)

    @classmethod
    def from_document(cls, document: Mapping[str, object]) -> PolicyConfig:
        """Build a configuration from a whole parsed ``mouthguard.toml``.

        A document without a ``[policy]`` table gets the defaults.
        """
        table = document.get("policy")
        if table is None:
            return cls()
        if not isinstance(table, Mapping):
            raise ConfigError("policy: must be a table")
        return cls.from_toml(table)


_LEVEL_SECTIONS = {
    "critical": Importance.CRITICAL,
    "golden": Importance.CRITICAL,
    "milestone": Importance.MILESTONE,
    "routine": Importance.ROUTINE,
    "transient": Importance.TRANSIENT,
}
_TOP_KEYS = (
    "trash_delay_seconds",
    "keep_within_seconds",
    "fast_keep_newest",
    "best_metric",
    "best_mode",
    "best_k",
    "max_delete_share",
)

_BOOL_KEYS = (
    "distinct_domains",
    "verify_before_counting",
    "all_durable_tiers",
    "legal_hold",
)
#: Keys that once existed but were never honoured by the write path: refused with
#: the reason, so a configuration relying on them learns it instead of being
#: silently ignored.
_REMOVED_KEYS = {
    "fsync": (
        "not a policy setting: a save is synced to stable storage before it is "
        "acknowledged exactly when its tier is durable, whatever its importance"
    ),
    "keep_on_fast": (
        "not a policy setting: every save lands on the fast tier first, and which "
        "checkpoints stay there is set by policy.fast_keep_newest (the newest "
        "critical checkpoint of a run stays too)"
    ),
}
#: keys a level section may set; transient's shape (one copy on fast) is fixed.
_LEVEL_KEYS: dict[Importance, tuple[str, ...]] = {
    Importance.CRITICAL: ("min_copies", *_BOOL_KEYS, "trash_delay_seconds"),
    Importance.MILESTONE: ("min_copies", *_BOOL_KEYS, "keep_last", "trash_delay_seconds"),
    Importance.ROUTINE: ("min_copies", *_BOOL_KEYS, "keep_last", "trash_delay_seconds"),
    Importance.TRANSIENT: ("verify_before_counting", "keep_last", "trash_delay_seconds"),
}


def _set_top(config: PolicyConfig, key: str, value: object) -> PolicyConfig:
    name = f"policy.{key}"
    parse = _TOP_PARSERS.get(key)
    if parse is not None:
        return replace(config, **{key: parse(name, value)})  # type: ignore[arg-type]  # each parser checks its key's type
    known = sorted([*_TOP_KEYS, *_LEVEL_SECTIONS])
    raise ConfigError(f"{name}: unknown key; known keys: {', '.join(known)}")


def _parse_level(
    section: str, importance: Importance, raw: object, base: LevelPolicy
) -> LevelPolicy:
    where = f"policy.{section}"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table")
    allowed = _LEVEL_KEYS[importance]
    changes: dict[str, object] = {}
    for key, value in raw.items():
        name = f"{where}.{key}"
        if key in _REMOVED_KEYS:
            raise ConfigError(f"{name}: {_REMOVED_KEYS[key]}")
        if key not in allowed:
            if importance is Importance.CRITICAL and key == "keep_last":
                raise ConfigError(f"{name}: critical checkpoints are never auto-deleted")
            raise ConfigError(f"{name}: unknown key; known keys: {', '.join(sorted(allowed))}")
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{name}: must be true or false, got {value!r}")
            changes[key] = value
        elif key == "min_copies":
            changes[key] = _integer(name, value)
        elif key == "keep_last":
            changes[key] = None if value == "all" else _integer(name, value)
        else:  # trash_delay_seconds
            changes[key] = _number(name, value)
    level = replace(base, **changes)  # type: ignore[arg-type]  # values checked above
    _check_level(importance, level, where)
    return level


def _check_level(importance: Importance, level: LevelPolicy, where: str = "") -> None:
    where = where or f"policy.{importance.value}"
    if importance is Importance.TRANSIENT:
        if level.min_copies != 1 or not level.fast_only:
            raise ConfigError(f"{where}: transient keeps exactly one copy, on the fast tier")
    else:
        # RF2 is the floor above transient: one copy is one failure away from loss.
        _check_count(f"{where}.min_copies", level.min_copies, 2, "(RF2 minimum above transient)")
        if level.fast_only:
            raise ConfigError(f"{where}.fast_only: only transient lives on the fast tier alone")
    if importance is Importance.CRITICAL and not level.never_auto_delete:
        raise ConfigError(f"{where}: critical checkpoints are never auto-deleted")
    if importance is not Importance.CRITICAL and level.never_auto_delete:
        raise ConfigError(f"{where}: only critical checkpoints are exempt from retention")
    if level.keep_last is not None:
        _check_count(f"{where}.keep_last", level.keep_last, 0)
    if level.trash_delay_seconds is not None:
        _check_delay(f"{where}.trash_delay_seconds", level.trash_delay_seconds)


def _check_count(name: str, value: object, minimum: int, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if value < minimum:
        suffix = f" {why}" if why else ""
        raise ConfigError(f"{name}: must be at least {minimum}{suffix}, got {value}")


def _check_delay(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{name}: must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}: must be a finite number of seconds >= 0, got {value!r}")


def _integer(name: str, value: object) -> int:
    # bool is an int in Python; `keep_last = true` is a typo, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    return value


def _number(name: str, value: object) -> float:
    _check_delay(name, value)
    assert isinstance(value, int | float)
    return float(value)


def _mode(name: str, value: object) -> BestMode:
    if value == "min":
        return "min"
    if value == "max":
        return "max"
    raise ConfigError(f"{name}: must be 'min' or 'max', got {value!r}")


def _string(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: must be a string, got {value!r}")
    return value


#: How each top-level key's value is checked (``replace`` then re-validates the whole).
_TOP_PARSERS: dict[str, Callable[[str, object], object]] = {
    "trash_delay_seconds": _number,
    "keep_within_seconds": _number,
    "fast_keep_newest": _integer,
    "best_k": _integer,
    "best_metric": _string,
    "best_mode": _mode,
    "max_delete_share": _number,
}
