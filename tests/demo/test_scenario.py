"""The demo scenario end to end (slow: real worker processes), plus its fast building blocks."""

from __future__ import annotations

import dataclasses
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
from mouthguard.demo import (
    CopyCheck,
    DamageKind,
    DemoConfig,
    DemoEvent,
    DemoReport,
    Phase,
    SaveStatus,
)
from mouthguard.demo.damage import (
    check_local_store,
    corrupt_checkpoint,
    delete_rank_file,
    replica_checks,
    set_aside_copies,
    verify_run,
)
from mouthguard.demo.diverged import diverge_and_resume
from mouthguard.demo.lifecycle import inspect_lifecycle, render_lifecycle
from mouthguard.demo.process import DemoError, WorkerProcess
from mouthguard.demo.scenario import default_run_name, run_scenario
from mouthguard.jobs.replicator import Replicator
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.memory import MemoryTier


@dataclass
class DemoRun:
    report: DemoReport
    events: list[DemoEvent]
    output: str
    exit_code: int
    store: Path


# One demo run serves every test here: one xdist worker runs them all, and the
# fixture is session-scoped so that other modules' tests run between these on that
# worker do not tear it down (each demo run is about a minute of CI).
pytestmark = pytest.mark.xdist_group("demo-scenario")


@pytest.fixture(scope="session")
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

    def test_every_step_was_replicated_before_the_kill(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        assert report.tiers == ("fast", "durable")
        copies = {(c.step, c.tier) for c in report.replicas if c.ok}
        steps = report.kill.listed_after_kill
        assert copies == {(s, t) for s in steps for t in report.tiers}

    def test_damage_hit_both_copies_of_40_and_the_fast_file_of_30(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        assert report.lost_step == 40
        damage = {(d.step, d.tier): d for d in report.damage}
        assert set(damage) == {(40, "fast"), (40, "durable"), (30, "fast")}
        assert damage[40, "fast"].kind is damage[40, "durable"].kind is DamageKind.CORRUPTED
        assert damage[40, "fast"].offset == damage[40, "durable"].offset > 0
        assert damage[40, "durable"].file.parts[-4] == "durable"
        assert damage[30, "fast"].kind is DamageKind.DELETED
        assert damage[30, "fast"].file.name == "rank-00000.safetensors"

    def test_load_rejected_40_on_both_tiers_then_the_fast_copy_of_30(
        self, demo_run: DemoRun
    ) -> None:
        resume = demo_run.report.resume
        assert [(r.step, r.tier) for r in resume.rejections] == [
            (40, "fast"),
            (40, "durable"),
            (30, "fast"),
        ]
        for rejection in resume.rejections[:2]:
            assert "checksum mismatch" in rejection.reason
        assert "no such file" in resume.rejections[2].reason
        assert len(resume.warnings) == 3
        assert "step 40 on tier 'fast'" in resume.warnings[0]
        assert "step 40 on tier 'durable'" in resume.warnings[1]
        assert demo_run.report.damage_rejected

    def test_resumed_from_30_read_from_durable(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        assert report.resume.step == report.lost_step - report.config.every == 30
        assert report.resume.tier == "durable"
        assert report.listed_final == tuple(range(10, report.config.steps + 1, 10))

    def test_damaged_copies_were_set_aside_by_save_and_by_replication(
        self, demo_run: DemoRun
    ) -> None:
        aside = {(a.step, a.tier): a for a in demo_run.report.set_aside}
        assert set(aside) == {(40, "fast"), (40, "durable"), (30, "fast")}
        assert aside[40, "fast"].by == "the re-save of step 40"
        assert aside[40, "durable"].by == aside[30, "fast"].by == "replication"
        for (step, _), record in aside.items():
            assert record.name.startswith(f"{step:012d}.rejected-")

    def test_store_verified_on_both_tiers_and_fast_30_repaired(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        steps = range(10, report.config.steps + 1, 10)
        assert {(c.step, c.tier) for c in report.verification} == {
            (s, t) for s in steps for t in report.tiers
        }
        assert report.store_verified
        # The file deleted from the fast copy of 30 is back, and it verifies now too.
        deleted = next(d for d in report.damage if d.kind is DamageKind.DELETED)
        assert deleted.file.is_file()
        store = mouthguard.open_store(demo_run.store)
        again = {(c.step, c.tier): c.ok for c in verify_run(store, report.run)}
        assert again[30, "fast"] and all(again.values())
        assert "20 copies on 2 tiers verified, 0 invalid" in demo_run.output

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
        ckpt = mouthguard.Checkpointer(demo_run.store, report.run, background=False)
        loaded = ckpt.load()
        assert loaded.step == report.config.steps
        assert loaded.rejected == []
        state = loaded.state
        assert isinstance(state, dict)
        assert state["metadata"]["loss"].hex() == report.reference.loss_hex

    def test_a_nan_newest_checkpoint_resumes_from_the_one_before(self, demo_run: DemoRun) -> None:
        diverged = demo_run.report.diverged
        assert diverged is not None
        last = demo_run.report.config.steps
        assert (diverged.good_step, diverged.nan_step, diverged.resumed_step) == (
            last,
            last + 1,
            last,
        )
        assert "NaN" in diverged.suspect
        assert f"step {last + 1} failed the load's check" in diverged.warning
        ckpt = mouthguard.Checkpointer(demo_run.store, diverged.run, background=False)
        info = ckpt.info(last + 1)
        assert info is not None
        assert "NaN" in info.suspect  # what ls and show give an operator
        assert "A checkpoint can verify and still be dead" in demo_run.output
        assert diverged.ok

    def test_save_records_tell_the_story(self, demo_run: DemoRun) -> None:
        saves = demo_run.report.saves
        statuses = {(s.step, s.phase): s.status for s in saves}
        assert statuses[(30, Phase.TRAIN)] is SaveStatus.COMMITTED
        assert statuses[(40, Phase.TRAIN)] is SaveStatus.CORRUPTED
        assert statuses[(50, Phase.TRAIN)] is SaveStatus.KILLED
        assert statuses[(40, Phase.RESUME)] is SaveStatus.COMMITTED
        assert (30, Phase.RESUME) not in statuses
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
        assert "read from tier durable" in text
        assert "fast ✗→✓ durable ✓" in text  # step 30: deleted, then repaired
        assert "fast ✗ durable ✗" in text  # step 40: lost on both tiers
        assert "restored by background replication from durable" in text
        assert "bitwise identical" in text
        assert f"--store {demo_run.store} ls {demo_run.report.run}" in text
        assert f"verify {demo_run.report.run}" in text

    def test_narrow_console_and_a_failed_verification(self, demo_run: DemoRun) -> None:
        console = Console(record=True, width=80, force_terminal=False)
        cli_demo._show(demo_run.report, console)
        assert "fast ✓ durable ✓" in console.export_text()
        broken = dataclasses.replace(
            demo_run.report,
            verification=(*demo_run.report.verification, CopyCheck(30, "fast", False, "boom")),
        )
        assert broken.matches and not broken.store_verified
        cli_demo._show(broken, console)
        assert "1 invalid" in console.export_text()

    def test_final_checkpoints_are_protected_by_their_importance(self, demo_run: DemoRun) -> None:
        life = demo_run.report.lifecycle
        assert [s.step for s in life.states] == list(range(10, 101, 10))
        assert {s.state for s in life.states} == {"protected"}
        assert all(s.copies == ("fast", "durable") for s in life.states)
        assert life.importance(100) == "critical"
        assert [s.step for s in life.states if s.importance == "milestone"] == [20, 40, 60, 80]
        assert dict(life.rules)["critical"].endswith("never auto-deleted")
        assert dict(life.rules)["routine"].endswith("the last 3 kept")

    def test_gc_dry_run_keeps_critical_and_milestones_drops_old_routine(
        self, demo_run: DemoRun
    ) -> None:
        gc = {d.step: d for d in demo_run.report.lifecycle.gc}
        assert list(gc) == list(range(10, 101, 10))
        assert gc[100].keep and gc[100].reasons == (
            "critical: never auto-deleted",
            "newest valid checkpoint",
        )
        assert gc[100].pins and gc[90].pins and not gc[80].pins
        for step in (20, 40, 60, 80):
            assert gc[step].keep
            assert gc[step].reasons == ("milestone: every valid milestone is kept",)
        for step in (50, 70, 90):
            assert gc[step].keep
            assert gc[step].reasons == ("routine: one of the last 3 valid routine checkpoints",)
        for step in (10, 30):
            assert not gc[step].keep and gc[step].deletes
            assert gc[step].reasons == ("routine: older than the last 3 valid routine checkpoints",)
            assert gc[step].tiers == (("fast", "trash"), ("durable", "trash"))
            assert gc[step].purge_after == 24 * 3600.0
        assert [s for s, d in gc.items() if d.deletes] == [10, 30]
        assert all(action == "keep" for d in gc.values() if d.keep for _, action in d.tiers)

    def test_gc_dry_run_deleted_nothing(self, demo_run: DemoRun) -> None:
        report = demo_run.report
        assert report.lifecycle.deleted_nothing
        assert report.lifecycle.listed_after == report.listed_final
        ckpt = mouthguard.Checkpointer(demo_run.store, report.run, background=False)
        infos = ckpt.list()
        assert [i.step for i in infos] == list(range(10, 101, 10))
        assert all(c.trashed_at is None for i in infos for c in i.copies)
        assert {i.state for i in infos} == {"protected"}
        text = demo_run.output
        assert "gc DRY RUN" in text
        assert "This was a dry run: nothing was deleted." in text
        assert "gc would delete steps 10, 30." in " ".join(text.split())
        assert "critical: never auto-deleted" in text
        assert "purged 24 h later" in text
        assert f"--store {demo_run.store} gc {report.run}\n" in text
        assert f"--store {demo_run.store} gc {report.run} --apply" in text
        # Rendering comes after the bitwise comparison.
        assert text.index("bitwise identical") < text.index("gc DRY RUN")


def test_default_run_name() -> None:
    name = default_run_name(dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC))
    assert name == "demo-20250304T050607Z"


@pytest.mark.parametrize(
    "kwargs", [{"kill_at_save": 2}, {"every": 0}, {"steps": 50}, {"kill_fraction": 1.0}]
)
def test_config_rejects_impossible_scenarios(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DemoConfig(**kwargs)  # type: ignore[arg-type]


def _save_two(ckpt: mouthguard.Checkpointer) -> None:
    for step in (1, 2):
        ckpt.save(
            step, {"w": torch.arange(1000, dtype=torch.float32) * step, "small": torch.ones(3)}
        )


def test_corrupt_checkpoint_makes_load_fall_back(ckpt: mouthguard.Checkpointer) -> None:
    _save_two(ckpt)
    record = corrupt_checkpoint(ckpt, 2)
    assert (record.step, record.tier, record.tensor, record.length) == (2, "fast", "w", 4)
    assert record.kind is DamageKind.CORRUPTED
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = ckpt.load()
    assert loaded.step == 1
    assert [r.step for r in loaded.rejected] == [2]
    assert any(issubclass(w.category, mouthguard.CheckpointFallbackWarning) for w in caught)


def test_damage_on_both_tiers_and_its_inspection(ckpt: mouthguard.Checkpointer) -> None:
    _save_two(ckpt)
    checks = replica_checks(ckpt, [1])
    assert [(c.tier, c.ok, c.reason) for c in checks] == [
        ("fast", False, "not verified"),  # a save alone leaves no receipt
        ("durable", False, "no copy"),
    ]
    Replicator(ckpt.store).run_once()
    assert all(c.ok for c in replica_checks(ckpt, [1, 2]))
    corrupt_checkpoint(ckpt, 2, "fast")
    corrupt_checkpoint(ckpt, 2, "durable")
    deleted = delete_rank_file(ckpt, 1, "fast")
    assert not deleted.file.exists() and deleted.kind is DamageKind.DELETED
    verdicts = {(c.step, c.tier): c.ok for c in verify_run(ckpt.store, "r")}
    assert verdicts == {(1, "fast"): False, (1, "durable"): True, (2, "fast"): False,
                        (2, "durable"): False}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mouthguard.CheckpointFallbackWarning)
        loaded = ckpt.load()
    assert (loaded.step, loaded.tier) == (1, "durable")
    assert [(r.step, r.tier) for r in loaded.rejected] == [(2, "fast"), (2, "durable"), (1, "fast")]
    # Sets aside the damaged copy that an intact one can replace, and repairs it; step 2
    # has no intact copy left, so both its copies stay in place and it is listed damaged.
    Replicator(ckpt.store).run_once()
    assert deleted.file.is_file()
    assert [(s, t) for s, t, _ in set_aside_copies(ckpt.store, "r")] == [(1, "fast")]
    assert [(i.step, i.state) for i in ckpt.list()] == [(1, "protected"), (2, "damaged")]


def test_the_diverged_side_run_is_protected_but_its_nan_step_never(tmp_path: Path) -> None:
    fast = LocalTier(tmp_path / "fast", "fast", "node-a")
    store = mouthguard.Store([fast, LocalTier(tmp_path / "dur", "dur", "node-b")])
    mouthguard.Checkpointer(store, "r", background=False).save(1, {"w": torch.ones(64)})
    Replicator(store).run_once()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mouthguard.CheckpointFallbackWarning)
        record = diverge_and_resume(store, "r")
    assert record.ok
    side = mouthguard.Checkpointer(store, record.run, background=False)
    assert side.info(record.good_step).state == "protected"  # type: ignore[union-attr]
    assert side.info(record.nan_step).state != "protected"  # type: ignore[union-attr]


def test_demo_needs_local_tiers(tmp_path: Path) -> None:
    check_local_store(mouthguard.open_store(tmp_path / "s"))
    with pytest.raises(DemoError, match="two or more local directory tiers"):
        check_local_store(mouthguard.Store([MemoryTier(name="fast")]))
    local = mouthguard.open_store(tmp_path / "s").fast
    with pytest.raises(DemoError, match="two or more local directory tiers"):
        check_local_store(mouthguard.Store([local, MemoryTier(name="ram")]))


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


def test_lifecycle_of_a_small_run(ckpt: mouthguard.Checkpointer) -> None:
    importance = {1: "routine", 2: "milestone", 3: "routine", 4: "routine", 5: "routine",
                  6: "routine", 7: "critical"}  # fmt: skip
    for step, level in importance.items():
        ckpt.save(step, {"w": torch.full((8,), float(step))}, importance=level)
    Replicator(ckpt.store).run_once()
    life = inspect_lifecycle(ckpt.store, "r")
    assert [(s.step, s.importance) for s in life.states] == list(importance.items())
    assert life.state(7) == "protected"
    gc = {d.step: d for d in life.gc}
    assert [s for s, d in gc.items() if not d.keep] == [1, 3]
    assert gc[7].reasons[0] == "critical: never auto-deleted"
    assert gc[2].keep and gc[1].tiers == (("fast", "trash"), ("durable", "trash"))
    assert life.deleted_nothing and life.listed_after == tuple(importance)
    console = Console(record=True, width=120, force_terminal=False)
    console.print(render_lifecycle(life, "r", Path("/s [x]"), ("fast", "durable")))
    text = console.export_text()
    assert "gc would delete steps 1, 3." in " ".join(text.split())
    assert "gc r --apply" in text and "'/s [x]'" in text
    broken = dataclasses.replace(life, trashed_after=(1,))
    console.print(render_lifecycle(broken, "r", Path("s"), ("fast", "durable")))
    assert "The dry run changed the store" in console.export_text()


@pytest.mark.slow
def test_the_demo_says_what_it_left_on_disk_and_has_a_json_form(demo_run: DemoRun) -> None:
    from mouthguard.cli.demo_summary import disk_use, report_json  # noqa: PLC0415
    from mouthguard.cli.render import human_bytes  # noqa: PLC0415

    disk = disk_use(demo_run.report)
    assert 0 < disk.run_bytes <= disk.store_bytes
    text = " ".join(demo_run.output.split())
    assert f"This run left {human_bytes(disk.run_bytes)} on disk in {demo_run.store}" in text
    assert f"rm -rf {demo_run.store}" in text
    body = report_json(demo_run.report, disk)
    assert body["ok"] is True and body["disk"] == {
        "run_bytes": disk.run_bytes,
        "store_bytes": disk.store_bytes,
    }
    assert body["resumed_from"] == {"step": 30, "tier": "durable"}
    print(f"demo run left {disk.run_bytes / 1e6:.0f} MB")  # the figure the README quotes
