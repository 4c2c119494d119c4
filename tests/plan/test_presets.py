"""Model presets and parameter-count parsing."""

from __future__ import annotations

import pytest

from mouthguard.plan import presets


def test_required_presets_exist_with_seed_figures() -> None:
    names = presets.preset_names()
    assert {"7b", "llama3-70b", "llama3-405b", "1t", "15t-moe"} <= set(names)
    # Seed metric table: Llama 3 70B on 16,384 GPUs; the 15T MoE on ~32,768.
    assert presets.get_preset("llama3-70b").gpus == 16_384
    moe = presets.get_preset("15t-moe")
    assert moe.gpus == 32_768
    assert moe.parameters == 15 * 10**12
    assert moe.window_seconds == 300  # "done in 5 minutes"
    assert presets.get_preset("llama3-70b").interval_seconds == 1800  # "every 30 minutes"
    # The per-day volume table assumes hourly saves for 7B and 1T.
    assert presets.get_preset("7b").interval_seconds == 3600
    assert presets.get_preset("1t").interval_seconds == 3600


def test_aliases_and_case() -> None:
    assert presets.get_preset("70B") is presets.get_preset("llama3-70b")
    assert presets.get_preset(" 15T ").name == "15t-moe"
    assert presets.get_preset("405b").parameters == 405 * 10**9


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt-9'.*llama3-70b"):
        presets.get_preset("gpt-9")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("70B", 70 * 10**9),
        ("1.5T", 1_500_000_000_000),
        ("7e9", 7 * 10**9),
        ("350m", 350 * 10**6),
        ("123456", 123_456),
    ],
)
def test_parse_parameters(text: str, count: int) -> None:
    assert presets.parse_parameters(text) == count


@pytest.mark.parametrize("text", ["", "seventy", "-5B", "0", "1.5X", "0.1"])
def test_parse_parameters_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        presets.parse_parameters(text)


def test_resolve_model_prefers_presets() -> None:
    name, count, preset = presets.resolve_model("70b")
    assert (name, count) == ("llama3-70b", 70 * 10**9)
    assert preset is not None and preset.gpus == 16_384
    _, count, preset = presets.resolve_model("2.5T")
    assert count == 2_500_000_000_000 and preset is None
    with pytest.raises(ValueError, match="unknown model"):
        presets.resolve_model("nope")
