"""``mouthguard plan`` through its own parser (main.py wires it separately)."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from mouthguard.cli import plan
from mouthguard.plan import intervals as iv

GB, TB = 1e9, 1e12
REQUIRED_KEYS = {
    "checkpoint_bytes",
    "per_gpu_shard_bytes",
    "bandwidth_needed_bytes_per_s",
    "optimal_interval_young_s",
    "optimal_interval_daly_s",
}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mouthguard")
    plan.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["plan", *argv])


def run_text(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = plan.run(parse(*argv), Console(file=out, width=120))
    return code, out.getvalue()


def run_json(*argv: str) -> dict[str, Any]:
    code, text = run_text(*argv, "--json")
    assert code == 0
    assert text.count("\n") == 1  # one object, one line

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-finite {name} in JSON")

    result: dict[str, Any] = json.loads(text, parse_constant=no_constants)
    return result


def close(value: float, expected: float) -> bool:
    return value == pytest.approx(expected, rel=0.05)


def test_llama3_70b_matches_the_seed_table() -> None:
    figures = run_json("llama3-70b")
    assert figures.keys() >= REQUIRED_KEYS
    # "840GB per Checkpoint"; "16k GPUs writing around 51MB each".
    assert figures["checkpoint_bytes"] == 840 * GB
    assert figures["gpus"] == 16_384
    assert close(figures["per_gpu_shard_bytes"], 51e6)
    assert figures["components_bytes"]["adam_m"] == 280 * GB


def test_15t_moe_matches_the_seed_table() -> None:
    figures = run_json("15t-moe")
    # "~180TB" burst, "~5.5GB" per GPU at ~32,768 GPUs, "600 GB/s" to land it in 5 minutes.
    assert figures["checkpoint_bytes"] == 180 * TB
    assert close(figures["per_gpu_shard_bytes"], 5.5 * GB)
    assert close(figures["bandwidth_needed_bytes_per_s"], 600 * GB)


@pytest.mark.parametrize(
    ("model", "per_day"),
    # Per-day table at hourly saves (weights + two 16-bit optimizer copies):
    # 7B 1 TB, 70B 10 TB, 1T 144 TB per day.
    [("7b", 1 * TB), ("70b", 10 * TB), ("1t", 144 * TB)],
)
def test_per_day_volumes(model: str, per_day: float) -> None:
    figures = run_json(
        model,
        *("--gpus", "1024", "--optimizer-dtype", "bf16", "--gradients-dtype", "none"),
        *("--interval-seconds", "3600"),
    )
    assert figures["bytes_per_parameter"] == 6
    assert close(figures["daily_write_bytes"], per_day)


def test_intervals_follow_young_and_daly() -> None:
    figures = run_json("70b", "--write-bandwidth", "100G", "--mtbf-hours", "16")
    cost, mtbf = figures["checkpoint_seconds"], figures["mtbf_seconds"]
    assert figures["checkpoint_seconds_source"] == "write_bandwidth"
    assert cost == pytest.approx(840 * GB / 100e9) == figures["time_to_land_s"]
    assert mtbf == 16 * 3600
    assert figures["optimal_interval_young_s"] == pytest.approx(math.sqrt(2 * cost * mtbf))
    assert figures["optimal_interval_daly_s"] == pytest.approx(iv.daly_interval(cost, mtbf))
    # Async: the stall (a 51 MB shard at 25 GB/s), not the write, enters the formulas,
    # but the next snapshot cannot start before the previous write has landed.
    stall = figures["stall_seconds"]
    assert stall == pytest.approx(840 * GB / 16_384 / 25e9)
    young_async = max(math.sqrt(2 * stall * mtbf), cost - stall)
    assert figures["optimal_interval_young_async_s"] == pytest.approx(young_async)


def test_overrides_and_defaults() -> None:
    figures = run_json("70b", "--checkpoint-seconds", "120", "--stall-seconds", "2")
    assert figures["checkpoint_seconds_source"] == "override"
    assert (figures["checkpoint_seconds"], figures["stall_seconds"]) == (120, 2)
    # Without a bandwidth the storage is assumed sized to land the save in the window.
    figures = run_json("70b", "--window-seconds", "600")
    assert figures["checkpoint_seconds"] == 600
    assert figures["checkpoint_seconds_source"] == "window"
    assert figures["time_to_land_s"] is None
    # Per-GPU MTBF divides by the GPU count.
    figures = run_json("2T", "--gpus", "1000", "--gpu-mtbf-hours", "50000")
    assert figures["mtbf_seconds"] == pytest.approx(50 * 3600)
    assert figures["parameters"] == 2 * 10**12
    assert figures["bytes_per_parameter"] == 12
    figures = run_json("70b", "--master-weights-dtype", "fp32")
    assert figures["checkpoint_bytes"] == 70e9 * 16


def test_costs_and_endurance() -> None:
    figures = run_json(
        "70b",
        *("--gpu-hour-usd", "2.5", "--mtbf-hours", "24", "--run-days", "14"),
        *("--drive-capacity", "30.72T", "--drives", "100", "--dwpd", "1"),
    )
    lost = figures["expected_lost_seconds_per_failure_sync"]
    per_failure = lost * 16_384 / 3600 * 2.5
    assert figures["lost_cost_usd_per_failure_sync"] == pytest.approx(per_failure)
    assert figures["expected_failures"] == pytest.approx(14)
    assert figures["lost_cost_usd_per_run_sync"] == pytest.approx(per_failure * 14)
    daily = figures["daily_write_bytes"]
    assert figures["drive_writes_per_day"] == pytest.approx(daily / (100 * 30.72 * TB))
    assert figures["endurance_used_fraction_run"] > 0
    assert run_json("70b")["lost_cost_usd_per_failure_sync"] is None


def test_table_renders() -> None:
    code, text = run_text("llama3-70b", "--gpu-hour-usd", "2", "--write-bandwidth", "100G")
    assert code == 0
    for fragment in ("840.0 GB", "51.3 MB", "280.0 GB", "Young", "Daly", "$", "16,384 GPUs"):
        assert fragment in text


@pytest.mark.parametrize(
    "argv",
    [
        ("70b", "--gpus", "0"),
        ("70b", "--gpus", "-3"),
        ("70b", "--write-bandwidth", "-5"),
        ("70b", "--interval-seconds", "soon"),
        ("70b", "--optimizer-dtype", "int3"),
        ("70b", "--mtbf-hours", "1", "--gpu-mtbf-hours", "1"),
        ("70b", "--run-days", "0"),
    ],
)
def test_bad_arguments_exit_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("gpt-9",), "unknown model 'gpt-9'"),
        (("7b",), "give --gpus"),
        (("1.5T",), "give --gpus"),
    ],
)
def test_bad_input_returns_2(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = run_text(*argv)
    assert code == 2
    assert text == ""
    assert message in capsys.readouterr().err


def test_the_mouthguard_command_runs_plan_and_simulate_without_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mouthguard.cli.main import main  # noqa: PLC0415 - the real entry point

    monkeypatch.chdir(tmp_path)  # no ./mouthguard-store here, and none is created
    assert main(["plan", "llama3-70b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_bytes"] == 840_000_000_000
    assert main(["simulate", "--preset", "llama3-70b", "--runs", "2", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["policies"]) == {
        "importance",
        "temperature",
        "flat",
        "peers",
    }
    assert not (tmp_path / "mouthguard-store").exists()


def test_the_model_is_positional_or_a_preset_flag() -> None:
    # `simulate` takes --preset; the same form works here, and the positional still does.
    assert run_json("--preset", "llama3-70b") == run_json("llama3-70b")


def test_no_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_text()
    assert code == 2 and text == ""
    assert "give a model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("70b", "--gpus", "0"), "argument --gpus: must be an integer >= 1: '0'"),
        (("70b", "--gpus", "x"), "argument --gpus: must be an integer >= 1: 'x'"),
        (("70b", "--run-days", "0"), "argument --run-days: must be > 0: '0'"),
        (("70b", "--interval-seconds", "soon"), "argument --interval-seconds: not a number"),
    ],
)
def test_bad_numbers_are_worded_for_people(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_the_peers_column_and_its_options() -> None:
    code, text = run_text("70b", "--gpu-hour-usd", "30", "--peer-failed-domains", "2")
    assert code == 0
    flat = " ".join(text.split())
    assert "peers" in flat and "a failure takes 2" in flat and "probability 0.000977" in flat
    figures = run_json("70b", "--peer-replication", "3", "--peer-gpus-per-domain", "16")
    assert (figures["peer_replication"], figures["peer_domains"]) == (3, 1024)
    code, text = run_text("7b", "--gpus", "8")
    assert code == 0 and "not possible, fewer domains than copies" in " ".join(text.split())
