"""Semantic checks on resume: intact bytes, broken state -- skipped, marked, kept track of."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

import mouthguard
from mouthguard import checks
from mouthguard.checks import CheckInput
from mouthguard.cli.main import main
from mouthguard.errors import SuspectCheckpointError
from mouthguard.jobs.replicator import Replicator
from mouthguard.jobs.retention import apply_retention
from mouthguard.policy.config import PolicyConfig
from tests.cli.helpers import show_json

RUN = "sem"


def _state(value: float) -> dict[str, object]:
    return {"model": {"w": torch.full((16,), value), "n": torch.arange(4)}, "step": 1}


def _ckpt(tmp_path: Path) -> mouthguard.Checkpointer:
    return mouthguard.Checkpointer(tmp_path / "store", RUN, background=False)


def test_a_nan_newest_checkpoint_is_skipped_with_a_warning_and_marked_suspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0))
    ckpt.save(2, _state(float("nan")))
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match=r"step 2 failed.*16 NaN"):
        loaded = ckpt.load(check=checks.finite())
    assert loaded.step == 1
    assert [r.step for r in loaded.rejected] == [2]
    info = ckpt.info(2)
    assert info is not None
    assert "NaN" in info.suspect
    assert ckpt.info(1).checked  # type: ignore[union-attr]
    # every later resume skips it, with or without a check, and says why
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match=r"step 2 is suspect.*NaN"):
        assert ckpt.load().step == 1
    # asked for by name, it loads without a check and is refused with one
    assert ckpt.load(2).step == 2
    with pytest.raises(SuspectCheckpointError, match="NaN"):
        ckpt.load(2, check=checks.finite())
    # ls and show name it with its reason
    capsys.readouterr()
    assert main(["--store", str(tmp_path / "store"), "ls"]) == 0
    listing = capsys.readouterr().out
    assert "suspect" in listing
    assert "NaN" in listing
    shown = show_json(tmp_path / "store", RUN, 2, capsys)
    assert "NaN" in str(shown["suspect"])
    assert show_json(tmp_path / "store", RUN, 1, capsys)["suspect"] is None


def test_inf_in_bfloat16_is_caught_and_integers_are_not_looked_at() -> None:
    state = {"a": torch.tensor([1.0, float("inf")], dtype=torch.bfloat16), "i": torch.arange(3)}
    reason = checks.finite()(CheckInput(5, state))
    assert reason is not None
    assert "state['a']: 0 NaN, 1 Inf" in reason
    assert checks.finite()(CheckInput(5, {"i": torch.arange(3), "best": math.inf})) is None


def test_a_reference_mismatch_is_skipped(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0), reference={"loss": 16.0})
    ckpt.save(2, _state(2.0), reference={"loss": 16.0})  # the state no longer gives that loss

    def loss(state: object) -> float:
        assert isinstance(state, dict)
        return float(state["model"]["w"].sum())

    with pytest.warns(mouthguard.CheckpointFallbackWarning, match=r"loss: saved 16, recomputed 32"):
        loaded = ckpt.load(check=checks.reference(loss=loss, rtol=1e-6))
    assert loaded.step == 1
    assert loaded.reference == {"loss": 16.0}
    assert "reference mismatch" in ckpt.info(2).suspect  # type: ignore[union-attr]


def test_reference_checks_refuse_missing_and_non_finite_values() -> None:
    check = checks.reference(loss=2.0, rtol=0.1)
    assert check(CheckInput(1, {}, {"loss": 2.1})) is None
    assert "no numeric reference saved" in str(check(CheckInput(1, {}, {})))
    assert "not finite" in str(check(CheckInput(1, {}, {"loss": math.nan})))
    both = checks.all_of(checks.finite(), check)
    assert "NaN" in str(both(CheckInput(1, {"w": torch.tensor([math.nan])}, {"loss": 2.0})))
    with pytest.raises(ValueError, match="at least one"):
        checks.reference()
    with pytest.raises(ValueError, match="tolerances"):
        checks.reference(loss=1.0, rtol=-1)


def test_a_check_that_returns_nonsense_is_a_type_error_not_a_verdict(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0))
    with pytest.raises(TypeError, match=r"None \(passed\) or a non-empty reason"):
        ckpt.load(check=lambda _: False)  # type: ignore[arg-type,return-value]
    assert ckpt.info(1).suspect == ""  # type: ignore[union-attr]


def test_retention_keeps_the_last_checkpoint_that_passed(tmp_path: Path) -> None:
    policy = PolicyConfig(trash_delay_seconds=0.0)
    kept = {}
    for checked in (True, False):
        ckpt = _ckpt(tmp_path / str(checked))
        ckpt.save(1, _state(1.0))
        if checked:
            assert ckpt.load(check=checks.finite()).step == 1
        # newer saves, never checked (the last one trained into NaN); routine keeps 3
        for step in (2, 3, 4, 5):
            ckpt.save(step, _state(float(step) if step < 5 else float("nan")))
        for _ in range(2):  # trash, then purge
            report = apply_retention(ckpt.store, policy, runs=[RUN])
        kept[checked] = ckpt.steps()
        if checked:
            reasons = {d.step: d.reasons for d in report.decisions}
            assert any("passed a check" in r for r in reasons[1])
            assert ckpt.load(1).step == 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mouthguard.CheckpointFallbackWarning)
            assert ckpt.load(check=checks.finite()).step == 4
    assert kept[True] == [1, 3, 4, 5]  # 1 stays: the last state a resume proved sound
    assert kept[False] == [3, 4, 5]  # without the check record, 1 would have gone


def test_save_guard_commits_a_nan_state_only_as_transient_and_suspect(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0), check=checks.finite())
    with pytest.warns(mouthguard.SuspectStateWarning, match="NaN"):
        ckpt.save(2, _state(float("nan")), importance="milestone", check=checks.finite())
    with pytest.warns(mouthguard.SuspectStateWarning, match="NaN"):
        ckpt.save_async(3, _state(float("nan")), check=checks.finite()).result()
    for step in (2, 3):
        info = ckpt.info(step)
        assert info is not None
        assert info.importance is mouthguard.Importance.TRANSIENT
        assert "NaN" in info.suspect
    assert ckpt.info(1).importance is mouthguard.Importance.ROUTINE  # type: ignore[union-attr]
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="suspect"):
        assert ckpt.load().step == 1


def test_replication_carries_the_verdict_to_every_copy(tmp_path: Path) -> None:
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0))
    ckpt.save(2, _state(float("nan")))
    with pytest.warns(mouthguard.CheckpointFallbackWarning):
        ckpt.load(check=checks.finite())
    replicator = Replicator(ckpt.store)
    replicator.run_once()  # new copies get the verdict with the other facts
    durable = ckpt.store.tier("durable")
    mark = f"{RUN}/{2:012d}/sidecar.suspect.json"
    assert durable.delete(mark)  # as if the tier had been unreachable when it was marked
    replicator.run_once()  # existing copies get it too
    assert durable.exists(mark)
    fast = ckpt.store.fast
    for step in (1, 2):  # the fast copies go (as a demotion does); the durable ones stay
        for key in list(fast.list(f"{RUN}/{step:012d}/")):
            fast.delete(key)
    assert "NaN" in ckpt.info(2).suspect  # type: ignore[union-attr]
    assert ckpt.info(1).checked  # type: ignore[union-attr]
    with pytest.warns(mouthguard.CheckpointFallbackWarning, match="suspect"):
        assert ckpt.load().step == 1


def test_a_resume_at_or_before_a_suspect_step_takes_the_one_before(tmp_path: Path) -> None:
    """The integrations' resume (a named step) honours the suspect mark like ``load()``."""
    ckpt = _ckpt(tmp_path)
    ckpt.save(1, _state(1.0))
    with pytest.warns(mouthguard.SuspectStateWarning):
        ckpt.save(2, _state(float("nan")), check=checks.finite())
    ckpt.save(3, _state(3.0))
    with pytest.warns(mouthguard.CheckpointFallbackWarning) as warned:
        loaded = ckpt.load(at_or_before=2)
    assert loaded.step == 1
    assert any(
        "falling back to step 1" in str(w.message) and "suspect" in str(w.message) for w in warned
    )


def test_every_report_calls_it_suspect_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc, verify (table and JSON), ls, show: one word and its reason, not "failed verification"."""
    ckpt = _ckpt(tmp_path)
    for step in (1, 2):
        ckpt.save(step, _state(1.0))
    with pytest.warns(mouthguard.SuspectStateWarning):
        ckpt.save(3, _state(float("nan")), importance="milestone", check=checks.finite())
    store = str(tmp_path / "store")
    reports = []
    for argv in (["gc"], ["verify"], ["ls"], ["show", RUN, "3"]):
        capsys.readouterr()
        assert main(["--store", store, *argv]) == 0, argv
        reports.append(" ".join(capsys.readouterr().out.split()))
    for argv, text in zip(("gc", "verify", "ls", "show"), reports, strict=True):
        assert "suspect" in text and "16 NaN" in text, argv
        assert "failed verification" not in text, argv
    capsys.readouterr()
    assert main(["--store", store, "verify", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    suspect = {line["step"]: line["suspect"] for line in lines}
    assert suspect[1] is None and suspect[2] is None and "16 NaN" in suspect[3]


def test_the_old_module_of_the_check_types_still_imports_with_a_warning() -> None:
    import importlib  # noqa: PLC0415 - the import under test
    import sys  # noqa: PLC0415

    sys.modules.pop("mouthguard.checkpoint.semantic", None)
    with pytest.warns(DeprecationWarning, match=r"mouthguard\.checks"):
        old = importlib.import_module("mouthguard.checkpoint.semantic")
    assert old.CheckInput is CheckInput and old.Check is checks.Check
