"""Resolving the run a question is about: given figures, then the preset's, then the defaults."""

from __future__ import annotations

import pytest

from mouthguard.plan import deployment as dp

GB = 1e9


def test_a_preset_fills_what_its_source_states() -> None:
    d = dp.resolve_deployment("llama3-70b")
    assert (d.label, d.parameters, d.gpus) == ("llama3-70b", 70 * 10**9, 16_384)
    assert d.interval_seconds == 1800.0  # the preset's "about every 30 minutes"
    assert d.window_seconds == dp.DEFAULT_WINDOW_S  # the preset names no window
    moe = dp.resolve_deployment("15t")
    assert moe.window_seconds == 300.0 and moe.gpus == 32_768


def test_given_figures_win_over_the_preset() -> None:
    d = dp.resolve_deployment("70b", gpus=8, interval_seconds=60.0, window_seconds=10.0)
    assert (d.gpus, d.interval_seconds, d.window_seconds) == (8, 60.0, 10.0)


def test_a_bare_parameter_count_takes_the_defaults() -> None:
    d = dp.resolve_deployment("2T", gpus=1000)
    assert d.label == "2,000,000,000,000 parameters" and d.parameters == 2 * 10**12
    assert d.interval_seconds == dp.DEFAULT_INTERVAL_S
    assert d.window_seconds == dp.DEFAULT_WINDOW_S


def test_a_missing_gpu_count_is_named() -> None:
    with pytest.raises(dp.MissingInputError) as exc:
        dp.resolve_deployment("7b")  # a preset without a GPU count
    assert exc.value.name == "gpus"
    assert str(exc.value) == "7b names no GPU count"
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        dp.resolve_deployment("gpt-9", gpus=1)


def test_a_sync_save_costs_the_override_else_the_write_else_the_window() -> None:
    burst = 840 * GB
    assert dp.sync_save_seconds(burst, 300.0, override=5.0, write_bandwidth=1e9) == (
        5.0,
        "override",
    )
    assert dp.sync_save_seconds(burst, 300.0, write_bandwidth=100 * GB) == (
        pytest.approx(8.4),
        "write_bandwidth",
    )
    assert dp.sync_save_seconds(burst, 300.0) == (300.0, "window")


def test_the_stall_is_the_override_else_the_shard_copied_to_the_host() -> None:
    assert dp.stall_seconds(51e6, override=2.0) == 2.0
    assert dp.stall_seconds(50 * GB) == pytest.approx(2.0)  # at the default 25 GB/s
    assert dp.stall_seconds(50 * GB, snapshot_bytes_per_s=50 * GB) == pytest.approx(1.0)


def test_the_job_mtbf_is_the_jobs_else_per_gpu_over_the_gpu_count() -> None:
    assert dp.job_mtbf(1000, mtbf_hours=16.0) == 16 * 3600.0
    assert dp.job_mtbf(1000, gpu_mtbf_hours=50_000.0) == pytest.approx(50 * 3600.0)
    # The default: 1.5 failures a day on 16,384 GPUs.
    assert dp.job_mtbf(16_384) == pytest.approx(86_400.0 / 1.5)
