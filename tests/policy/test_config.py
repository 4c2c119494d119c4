"""Policy configuration: the default levels, the [policy] table, and clear errors."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from mouthguard.errors import ConfigError
from mouthguard.policy import Importance, LevelPolicy, PolicyConfig


def test_defaults_implement_the_design_table() -> None:
    config = PolicyConfig()
    critical = config.level(Importance.CRITICAL)
    assert critical.all_durable_tiers and critical.verify_before_counting
    assert critical.legal_hold and critical.never_auto_delete and critical.keep_last is None
    assert critical.min_copies == 2 and critical.distinct_domains
    milestone = config.level(Importance.MILESTONE)
    assert (milestone.min_copies, milestone.distinct_domains) == (2, True)
    assert milestone.verify_before_counting and milestone.keep_last is None
    routine = config.level(Importance.ROUTINE)
    assert (routine.min_copies, routine.distinct_domains, routine.keep_last) == (2, True, 3)
    transient = config.level(Importance.TRANSIENT)
    assert (transient.min_copies, transient.fast_only) == (1, True)
    assert transient.keep_last == 1
    assert config.trash_delay_seconds == 86400
    assert config.trash_delay(Importance.ROUTINE) == 86400
    assert config.trash_delay(Importance.TRANSIENT) == 0
    assert config.fast_keep_newest == 2
    assert config.best_metric is None


def test_from_toml_reads_a_policy_table() -> None:
    document = tomllib.loads(
        """
        [policy]
        trash_delay_seconds = 3600
        keep_within_seconds = 600.5
        fast_keep_newest = 1
        best_metric = "loss"
        best_mode = "max"
        best_k = 2

        [policy.routine]
        keep_last = 5
        min_copies = 3

        [policy.milestone]
        keep_last = 10

        [policy.golden]
        min_copies = 3

        [policy.transient]
        trash_delay_seconds = 60
        """
    )
    config = PolicyConfig.from_document(document)
    assert config.trash_delay_seconds == 3600.0
    assert config.keep_within_seconds == 600.5
    assert config.fast_keep_newest == 1
    assert (config.best_metric, config.best_mode, config.best_k) == ("loss", "max", 2)
    assert config.level(Importance.ROUTINE).keep_last == 5
    assert config.level(Importance.ROUTINE).min_copies == 3
    assert config.level(Importance.MILESTONE).keep_last == 10
    assert config.level(Importance.CRITICAL).min_copies == 3
    assert config.trash_delay(Importance.TRANSIENT) == 60
    # untouched levels keep their defaults
    assert config.level(Importance.CRITICAL).all_durable_tiers


def test_milestone_keep_last_all_and_empty_document() -> None:
    assert (
        PolicyConfig.from_toml({"milestone": {"keep_last": "all"}})
        .level(Importance.MILESTONE)
        .keep_last
        is None
    )
    assert PolicyConfig.from_document({"tiers": []}) == PolicyConfig()
    assert PolicyConfig.from_toml({}) == PolicyConfig()


def test_missing_levels_get_defaults_and_are_read_only() -> None:
    custom = LevelPolicy(
        min_copies=3, distinct_domains=True, verify_before_counting=True, keep_last=7
    )
    config = PolicyConfig(levels={Importance.ROUTINE: custom})
    assert config.level(Importance.ROUTINE) is custom
    assert config.level(Importance.CRITICAL).never_auto_delete
    with pytest.raises(TypeError):
        config.levels[Importance.ROUTINE] = custom  # type: ignore[index]


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"trash_delay": 5}, r"^policy\.trash_delay: unknown key"),
        ({"routine": {"keep": 3}}, r"^policy\.routine\.keep: unknown key"),
        ({"routine": {"min_copies": 1}}, r"policy\.routine\.min_copies: must be at least 2 \(RF2"),
        ({"milestone": {"min_copies": 1}}, r"policy\.milestone\.min_copies: must be at least 2"),
        ({"critical": {"min_copies": 0}}, r"policy\.critical\.min_copies: must be at least 2"),
        ({"routine": {"min_copies": "2"}}, r"policy\.routine\.min_copies: must be an integer"),
        ({"routine": {"min_copies": True}}, r"policy\.routine\.min_copies: must be an integer"),
        ({"routine": {"keep_last": -1}}, r"policy\.routine\.keep_last: must be at least 0"),
        ({"routine": {"keep_last": 2.5}}, r"policy\.routine\.keep_last: must be an integer"),
        ({"routine": {"legal_hold": 1}}, r"policy\.routine\.legal_hold: must be true or false"),
        (
            {"transient": {"fsync": False}},
            r"policy\.transient\.fsync: not a policy setting: .*durable",
        ),
        (
            {"routine": {"keep_on_fast": False}},
            r"policy\.routine\.keep_on_fast: not a policy .*fast_keep_newest",
        ),
        ({"routine": 3}, r"policy\.routine: must be a table"),
        ({"critical": {"keep_last": 3}}, r"policy\.critical\.keep_last: critical .* never auto"),
        ({"golden": {"keep_last": 3}}, r"policy\.golden\.keep_last: critical .* never auto"),
        ({"transient": {"min_copies": 2}}, r"policy\.transient\.min_copies: unknown key"),
        ({"trash_delay_seconds": -1}, r"policy\.trash_delay_seconds: must be a finite"),
        ({"trash_delay_seconds": float("inf")}, r"policy\.trash_delay_seconds: must be a finite"),
        ({"trash_delay_seconds": "1d"}, r"policy\.trash_delay_seconds: must be a number"),
        ({"routine": {"trash_delay_seconds": -5}}, r"policy\.routine\.trash_delay_seconds"),
        ({"keep_within_seconds": -1}, r"policy\.keep_within_seconds: must be a finite"),
        ({"fast_keep_newest": -1}, r"policy\.fast_keep_newest: must be at least 0"),
        ({"best_metric": "loss", "best_mode": "lowest"}, r"policy\.best_mode: must be 'min' or"),
        ({"best_metric": "loss", "best_k": -2}, r"policy\.best_k: must be at least 0"),
        ({"best_metric": 3}, r"policy\.best_metric: must be a string"),
        ({"best_metric": ""}, r"policy\.best_metric: must be a non-empty"),
        ({"best_k": 2}, r"policy\.best_k: set without policy\.best_metric"),
        ({"critical": {}, "golden": {}}, r"policy\.golden: critical is configured twice"),
    ],
)
def test_bad_values_name_the_key(table: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PolicyConfig.from_toml(table)


def test_policy_that_is_not_a_table() -> None:
    with pytest.raises(ConfigError, match=r"^policy: must be a table"):
        PolicyConfig.from_document({"policy": 3})


def test_direct_construction_is_checked_too() -> None:
    weak = LevelPolicy(min_copies=1, distinct_domains=False, verify_before_counting=False)
    with pytest.raises(ConfigError, match=r"policy\.routine\.min_copies: must be at least 2"):
        PolicyConfig(levels={Importance.ROUTINE: weak})
    deletable = LevelPolicy(min_copies=2, distinct_domains=True, verify_before_counting=True)
    with pytest.raises(ConfigError, match="critical checkpoints are never auto-deleted"):
        PolicyConfig(levels={Importance.CRITICAL: deletable})
    with pytest.raises(ConfigError, match=r"policy\.best_mode"):
        PolicyConfig(best_mode="median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"policy\.trash_delay_seconds"):
        PolicyConfig(trash_delay_seconds=float("nan"))
