"""The demo scenario end to end (slow: real worker processes), plus its fast building blocks."""

from __future__ import annotations

import datetime as dt
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rich.console import Console

import mouthguard
from mouthguard.cli import demo as cli_demo
from mouthguard.demo import DemoConfig, DemoEvent, DemoReport, Phase, SaveStatus
from mouthguard.demo.scenario import corrupt_checkpoint, default_run_name, run_scenario
from mouthguard.demo.worker import DemoError, WorkerProcess


@dataclass
class DemoRun:
    report: DemoReport
    events: list[DemoEvent]
    output: str
    exit_code: int
    store: Path


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One real ``run_demo`` on a fresh store, capturing its report and events."""
    store = tmp_path_factory.mktemp("demo") / "store"
    captured: list[DemoReport] = []
    events: list[DemoEvent] = []

    def spy(path: Path, **kwargs: object) -> DemoReport:
        callback = kwargs["on_event"]
        assert callable(callback)

        def both(event: DemoEvent) -> None:
            events.append(event)
            callback(event)

        report = run_scenario(path, on_event=both)
        captured.append(report)
        return report

    console = Console(record=True, width=120, force_terminal=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_demo, "run_scenario", spy)
        code = cli_demo.run_demo(store, console)
    return DemoRun(captured[0], events, console.export_text(), code, store)


@pytest.mark.slow
class TestScenario:
    def test_killed_step_was_never_visible_and_left_a_partial_dir(self, demo_run: DemoRun) -> None:
        kill = demo_run.report.kill
        assert kill.step == DemoConfig().kill_step
        assert kill.step not in kill.listed_after_kill
        assert kill.listed_after_kill == tuple(range(10, kill.step, 10))
        assert kill.partial_dir.is_dir()
        assert kill.partial_dir.name.startswith(f"{kill.step:012d}.partial-")
        assert kill.file.parent == kill.partial_dir
        assert not (kill.partial_dir / "manifest.json").exists()
        assert 0 < kill.bytes_on_disk < kill.expected_bytes

    def test_corrupted_step_was_rejected_with_a_checksum_reason(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        bad = report.corruption
        assert bad.step == max(report.kill.listed_after_kill)
        assert bad.file.name == "rank-00000.safetensors"
        rejected = [r for r in report.resume.rejections if r.step == bad.step]
        assert len(rejected) == 1
        assert "checksum" in rejected[0].reason
        assert len(report.resume.warnings) == len(report.resume.rejections)
        assert f"step {bad.step}" in report.resume.warnings[0]
        assert report.corruption_rejected

    def test_resumed_from_the_previous_checkpoint(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        assert report.resume.step == report.corruption.step - report.config.every
        # Re-saving the corrupted step set the damaged copy aside and committed.
        assert len(report.set_aside) == 1
        assert report.set_aside[0].startswith(f"{report.corruption.step:012d}.rejected-")
        assert report.listed_final == tuple(range(10, report.config.steps + 1, 10))

    def test_resumed_run_matches_reference_bitwise(self, demo_run: DemoRun) -> None:
        ref, res = demo_run.report.reference, demo_run.report.resumed
        assert res.step == ref.step == demo_run.report.config.steps
        assert res.loss_hex == ref.loss_hex
        assert res.weights_sha256 == ref.weights_sha256
        assert res.optimizer_sha256 == ref.optimizer_sha256
        assert demo_run.report.matches
        assert demo_run.exit_code == 0

    def test_final_checkpoint_restores_the_reference_weights(self, demo_run: DemoRun) -> None:
        # Independent of the workers' digests: load the last checkpoint here.
        report = demo_run.report
        loaded = mouthguard.Checkpointer(demo_run.store, report.run).load()
        assert loaded.step == report.config.steps
        assert loaded.rejected == []
        state = loaded.state
        assert isinstance(state, dict)
        assert state["metadata"]["loss"].hex() == report.reference.loss_hex

    def test_save_records_tell_the_story(self, demo_run: DemoRun) -> None:
        saves = demo_run.report.saves
        statuses = {(s.step, s.phase): s.status for s in saves}
        assert statuses[(40, Phase.TRAIN)] is SaveStatus.CORRUPTED
        assert statuses[(50, Phase.TRAIN)] is SaveStatus.KILLED
        assert statuses[(40, Phase.RESUME)] is SaveStatus.COMMITTED
        importance = {s.step: s.importance for s in saves}
        assert importance[10] == "routine"
        assert importance[20] == "milestone"
        assert importance[100] == "critical"

    def test_progress_events_and_output(self, demo_run: DemoRun) -> None:
        phases = {e.phase for e in demo_run.events}
        assert phases == set(Phase)
        assert any("SIGKILL" in e.message for e in demo_run.events)
        text = demo_run.output
        assert "killed mid-save" in text
        assert "CheckpointFallbackWarning" in text
        assert "bitwise identical" in text
        assert f"--store {demo_run.store} ls {demo_run.report.run}" in text
        assert f"verify {demo_run.report.run}" in text


def test_default_run_name() -> None:
    name = default_run_name(dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC))
    assert name == "demo-20250304T050607Z"


@pytest.mark.parametrize(
    "kwargs", [{"kill_at_save": 2}, {"every": 0}, {"steps": 50}, {"kill_fraction": 1.0}]
)
def test_config_rejects_impossible_scenarios(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DemoConfig(**kwargs)  # type: ignore[arg-type]


def test_corrupt_checkpoint_makes_load_fall_back(ckpt: mouthguard.Checkpointer) -> None:
    for step in (1, 2):
        ckpt.save(
            step, {"w": torch.arange(1000, dtype=torch.float32) * step, "small": torch.ones(3)}
        )
    record = corrupt_checkpoint(ckpt, 2)
    assert (record.step, record.tensor, record.length) == (2, "w", 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = ckpt.load()
    assert loaded.step == 1
    assert [r.step for r in loaded.rejected] == [2]
    assert any(issubclass(w.category, mouthguard.CheckpointFallbackWarning) for w in caught)


@pytest.mark.slow
def test_worker_errors_are_reported_not_hung(tmp_path: Path) -> None:
    # Resuming a run that has no checkpoint: the worker reports an error event and exits 1.
    args = ["--store", str(tmp_path / "s"), "--run", "empty", "--steps", "2", "--resume"]
    with WorkerProcess(args, timeout=60) as worker:
        kinds = []
        while (event := worker.next_event()) is not None:
            kinds.append(event["event"])
        assert kinds == ["start", "error"]
        assert worker.reap() == 1
        error = worker.failure("boom")
    assert isinstance(error, DemoError)
    assert re.search(r"exit status 1", str(error))
