"""What the chaos and S3 harnesses report: counts by kind, exclusions, and "not run"."""

from __future__ import annotations

from collections import Counter

import pytest

from mouthguard.chaos import DEFAULT_FAULTS, ChaosReport
from reliability import chaos, s3_faults
from tests.s3.ceph import CephStartError


def test_s3_harness_without_a_server_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_faults, "missing_binaries", lambda: ["radosgw"])
    result = s3_faults.run("ci")
    assert (result.status, result.ok, result.cases) == ("not run", False, 0)
    assert result.not_run.startswith("no S3 server: Ceph RGW is not installed (missing radosgw)")


def test_s3_harness_whose_server_does_not_start_is_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoCluster:
        def __enter__(self) -> None:
            raise CephStartError("monitor did not come up\nlog follows")

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(s3_faults, "missing_binaries", list)
    monkeypatch.setattr(s3_faults, "CephCluster", NoCluster)
    result = s3_faults.run("ci")
    assert result.status == "not run"
    assert result.not_run == "no S3 server: the Ceph RGW did not start: monitor did not come up"


def test_chaos_result_breaks_the_faults_down_and_names_the_exclusions() -> None:
    report = ChaosReport(
        run="c",
        plan=DEFAULT_FAULTS,
        seed=1,
        injected=Counter({"delay": 50, "enospc": 7, "torn": 2, "flip": 0}),
        survived=59,
        acknowledged=40,
        lost_to_storage=2,
        deleted_by_policy=11,
    )
    result = chaos._result(report, [], "ci", "rerun", 1.0)
    assert result.cases == 59 and result.status == "passed"
    assert result.cases_by_kind == {
        "delays of 0.5 ms (no error)": 50,
        "ENOSPC part-way through a write": 7,
        "torn writes acknowledged by the storage": 2,
    }
    assert result.acknowledged == 40
    assert result.excluded == {chaos.LOST_TO_STORAGE: 2, chaos.DELETED_BY_POLICY: 11}
    assert "acknowledged" in chaos.LOST_TO_STORAGE and "torn or short" in chaos.LOST_TO_STORAGE
