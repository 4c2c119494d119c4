"""Model presets: parameter counts and the deployment figures the sources give for them.

A preset only fills in what a source document states (GPU count, save
interval, write window); anything it leaves as ``None`` must come from the
user or the command's documented default. The state layout (which tensors, in
which dtypes) is not part of a preset: see :mod:`mouthguard.plan.sizing`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "PRESETS",
    "ModelPreset",
    "get_preset",
    "parse_parameters",
    "preset_names",
    "resolve_model",
]


@dataclass(frozen=True)
class ModelPreset:
    """One model size and the figures its source reports.

    Attributes:
        name: canonical preset name (lower case).
        parameters: total parameter count (every expert of an MoE: the
            checkpoint saves them all, whatever is active per token).
        gpus: GPUs the source trains it on, or None if it names none.
        interval_seconds: the source's checkpoint interval, or None.
        window_seconds: the source's time budget to land one checkpoint, or None.
        source: where the figures come from, for the reader.
    """

    name: str
    parameters: int
    gpus: int | None = None
    interval_seconds: float | None = None
    window_seconds: float | None = None
    source: str = ""


_MINUTE, _HOUR = 60.0, 3600.0

_PRESETS = (
    ModelPreset(
        "7b",
        7_000_000_000,
        interval_seconds=_HOUR,
        source="per-day checkpoint volume table, hourly saves",
    ),
    ModelPreset(
        "llama3-70b",
        70_000_000_000,
        gpus=16_384,
        interval_seconds=30 * _MINUTE,
        source="Llama 3 70B: 16,384 GPUs, ~51 MB each, about every 30 minutes",
    ),
    ModelPreset(
        "llama3-405b",
        405_000_000_000,
        # Meta's Llama 3 report trained 405B on 16K H100s; the figures quoted for
        # Llama 3 give the cluster size generally, not a separate 405B one.
        gpus=16_384,
        interval_seconds=30 * _MINUTE,
        source="Llama 3 405B on the same 16K-GPU cluster class as 70B",
    ),
    ModelPreset(
        "1t",
        1_000_000_000_000,
        interval_seconds=_HOUR,
        source="per-day checkpoint volume table (1T+), hourly saves",
    ),
    ModelPreset(
        "15t-moe",
        15_000_000_000_000,
        gpus=32_768,
        # The source says every 10-30 minutes; the upper end, like the 70B case.
        interval_seconds=30 * _MINUTE,
        window_seconds=5 * _MINUTE,
        source="15T-parameter MoE: ~32,768 GPUs, ~5.5 GB each, land 180 TB in 5 minutes",
    ),
)

_ALIASES = {"70b": "llama3-70b", "405b": "llama3-405b", "15t": "15t-moe"}

#: Preset name (canonical names and aliases) -> preset.
PRESETS: Mapping[str, ModelPreset] = MappingProxyType(
    {p.name: p for p in _PRESETS}
    | {alias: next(p for p in _PRESETS if p.name == name) for alias, name in _ALIASES.items()}
)


def preset_names() -> list[str]:
    """Canonical preset names, smallest model first (aliases left out)."""
    return [p.name for p in _PRESETS]


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name`` (case-insensitive, aliases accepted).

    Raises :class:`ValueError` naming the known presets if there is none.
    """
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        known = ", ".join(preset_names())
        aliases = ", ".join(f"{a}={n}" for a, n in _ALIASES.items())
        raise ValueError(
            f"unknown model preset {name!r}; known: {known} (aliases {aliases})"
        ) from None


_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?|\.\d+(?:e\d+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_parameters(text: str) -> int:
    """A parameter count from ``"70B"``, ``"1.5T"``, ``"7e9"`` or ``"70000000000"``.

    Suffixes are decimal (K=1e3, M=1e6, B or G=1e9, T=1e12), as model names use
    them. Raises :class:`ValueError` for anything else or a count below 1.
    """
    match = _COUNT.match(text)
    if match is None:
        raise ValueError(f"not a parameter count: {text!r} (try 70B, 1.5T or 7e9)")
    count = round(float(match.group(1)) * _SUFFIX[match.group(2).lower()])
    if count < 1:
        raise ValueError(f"a model needs at least one parameter, got {text!r}")
    return count


def resolve_model(text: str) -> tuple[str, int, ModelPreset | None]:
    """A model given as a preset name or a parameter count: ``(label, parameters, preset)``.

    Preset names win (``"70b"`` is the Llama 3 70B preset, with its GPU count);
    otherwise the text must be a count for :func:`parse_parameters`.
    """
    key = text.strip().lower()
    if key in PRESETS:
        preset = PRESETS[key]
        return preset.name, preset.parameters, preset
    try:
        count = parse_parameters(text)
    except ValueError:
        known = ", ".join(preset_names())
        raise ValueError(
            f"unknown model {text!r}: give a preset ({known}) or a parameter count (70B, 7e9)"
        ) from None
    return f"{count:,} parameters", count, None
