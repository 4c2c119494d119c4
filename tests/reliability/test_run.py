"""The harness runner: registry, results, the table between the markers, exit status."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from reliability.record import HarnessResult

from reliability import run as runner

DOC = """# Reliability

Intro paragraph, kept as is.

<!-- harnesses:begin -->
| harness | old header |
|---|---|
| `other` (ci) | an earlier row that must survive a run of another harness |
<!-- harnesses:end -->

| the | tests table |
|---|---|
| stays | byte-identical |
trailing text without a final newline"""


def _write_fake(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(body))


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fake harness modules on sys.path: one ok, one failing, one raising."""
    mods = tmp_path / "mods"
    mods.mkdir()
    _write_fake(
        mods,
        "fake_ok_harness",
        """
        from reliability.record import HarnessResult

        def run(level):
            return HarnessResult(
                harness="fake-ok", what="tried | things", cases=3, survived=3,
                command=f"fake --level {level}", seconds=1.5,
            )
        """,
    )
    _write_fake(
        mods,
        "fake_bad_harness",
        """
        from reliability.record import HarnessResult

        def run(level):
            return HarnessResult(harness="fake-bad", what="x", cases=2, survived=1,
                                 lost_acknowledged=1)
        """,
    )
    _write_fake(
        mods,
        "fake_skipped_harness",
        """
        from reliability.record import HarnessResult

        def run(level):
            return HarnessResult.skipped("fake-skipped", "no server here", command="fake")
        """,
    )
    _write_fake(mods, "fake_raising_harness", "def run(level):\n    raise RuntimeError('boom')\n")
    _write_fake(mods, "fake_broken_harness", "import nonexistent_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(mods))
    return {
        "ok": "fake_ok_harness",
        "bad": "fake_bad_harness",
        "skipped": "fake_skipped_harness",
        "raising": "fake_raising_harness",
        "broken": "fake_broken_harness",
        "missing": "fake_missing_harness_module",
    }


def _main(tmp_path: Path, registry: dict[str, str], *extra: str) -> tuple[int, str]:
    doc = tmp_path / "reliability.md"
    if not doc.exists():
        doc.write_text(DOC)
    argv = ["--out", str(doc), "--json-dir", str(tmp_path / "json"), *extra]
    code = runner.main(argv, registry=registry)
    return code, doc.read_text()


def test_marker_rewrite_keeps_the_rest_of_the_doc_byte_identical(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    code, text = _main(tmp_path, {"ok": fakes["ok"], "other": fakes["missing"]}, "--only", "ok")
    assert code == 0
    before, _, after = DOC.partition("<!-- harnesses:begin -->")
    _, _, after = after.partition("<!-- harnesses:end -->")
    assert text.startswith(before + "<!-- harnesses:begin -->\n")
    assert text.endswith("<!-- harnesses:end -->" + after)
    section = text[len(before) : len(text) - len(after)]
    lines = section.splitlines()
    assert lines[1] == runner.HEADER.splitlines()[0]
    ok_row = next(line for line in lines if line.startswith("| `ok`"))
    assert (
        ok_row
        == "| `ok` (ci) | tried \\| things | 3 | 3 | 0 | 0 | - | 0 | 1.5 | `fake --level ci` |"
    )
    # the row of a harness not run this time is kept as it was
    assert "| `other` (ci) | an earlier row that must survive a run of another harness |" in lines
    # a second run gives the same file: the rewrite is idempotent
    code, again = _main(tmp_path, {"ok": fakes["ok"], "other": fakes["missing"]}, "--only", "ok")
    assert (code, again) == (0, text)
    result = json.loads((tmp_path / "json" / "ok.json").read_text())
    assert result["ok"] is True
    assert result["cases"] == 3


def test_failing_harness_exits_1_and_is_marked(tmp_path: Path, fakes: dict[str, str]) -> None:
    code, text = _main(tmp_path, {"ok": fakes["ok"], "bad": fakes["bad"]})
    assert code == 1
    bad_row = next(line for line in text.splitlines() if line.startswith("| `bad`"))
    assert "**FAILED**" in bad_row
    assert "| 2 | 1 | 0 | 1 | - | 0 |" in bad_row
    assert json.loads((tmp_path / "json" / "bad.json").read_text())["ok"] is False


def test_raising_harness_is_a_failed_result(tmp_path: Path, fakes: dict[str, str]) -> None:
    code, text = _main(tmp_path, {"raising": fakes["raising"]})
    assert code == 1
    row = next(line for line in text.splitlines() if line.startswith("| `raising`"))
    assert "RuntimeError: boom" in row
    assert (
        "boom" in json.loads((tmp_path / "json" / "raising.json").read_text())["details"]["error"]
    )


def test_missing_or_broken_module_is_not_available_not_a_crash(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    registry = {"ok": fakes["ok"], "missing": fakes["missing"], "broken": fakes["broken"]}
    code, text = _main(tmp_path, registry)
    assert code == runner.EXIT_NOT_RUN  # nothing failed, but not everything ran
    rows = {runner._row_name(line): line for line in text.splitlines() if line.startswith("| `")}
    assert "**NOT RUN**" in rows["missing"]
    assert "not available (not written yet)" in rows["missing"]
    assert "not available (fails to import: ModuleNotFoundError" in rows["broken"]
    assert not (tmp_path / "json" / "missing.json").exists()
    # --strict makes a missing harness a failure
    code, _ = _main(tmp_path, registry, "--strict")
    assert code == 1


def test_unknown_name_and_missing_markers_are_usage_errors(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _main(tmp_path, {"ok": fakes["ok"]}, "--only", "nope")
    assert exc.value.code == 2
    doc = tmp_path / "plain.md"
    doc.write_text("no markers here\n")
    with pytest.raises(SystemExit) as exc:
        runner.main(["--out", str(doc), "--json-dir", str(tmp_path / "j")], registry=fakes)
    assert exc.value.code == 2
    assert doc.read_text() == "no markers here\n"


def test_the_real_registry_names_every_harness_of_issue_6() -> None:
    assert list(runner.REGISTRY) == [
        "crash",
        "powerloss",
        "rankdeath",
        "chaos",
        "s3_faults",
        "fuzz",
        "security",
    ]
    assert all(m == f"reliability.{n}" for n, m in runner.REGISTRY.items())


def test_a_harness_that_could_not_run_is_not_run_never_passed(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    registry = {"ok": fakes["ok"], "skipped": fakes["skipped"]}
    code, text = _main(tmp_path, registry)
    assert code == runner.EXIT_NOT_RUN
    row = next(line for line in text.splitlines() if line.startswith("| `skipped`"))
    assert row.startswith("| `skipped` (ci) **NOT RUN** | not run: no server here | - |")
    assert row.count("|") == runner.COLUMNS + 1
    written = json.loads((tmp_path / "json" / "skipped.json").read_text())
    assert (written["status"], written["ok"], written["cases"]) == ("not run", False, 0)
    code, _ = _main(tmp_path, registry, "--strict")
    assert code == 1
    # a failure elsewhere still wins: 1, not 3
    code, _ = _main(tmp_path, {"bad": fakes["bad"], "skipped": fakes["skipped"]})
    assert code == 1


def test_exit_status() -> None:
    assert runner.exit_status(["passed", "passed"]) == 0
    assert runner.exit_status(["passed", "not run"]) == 3
    assert runner.exit_status(["passed", "not run"], strict=True) == 1
    assert runner.exit_status(["not run", "failed"]) == 1
    assert runner.exit_status([]) == 0


def test_record_status_and_round_trip(tmp_path: Path) -> None:
    ran_nothing = HarnessResult.skipped("s3-faults", "no S3 server")
    assert (ran_nothing.status, ran_nothing.ok, ran_nothing.ran) == ("not run", False, False)
    assert HarnessResult("h", "w", cases=2, survived=2).status == "passed"
    assert HarnessResult("h", "w", cases=2, survived=1).status == "failed"
    full = HarnessResult(
        "chaos",
        "w",
        cases=5,
        survived=5,
        cases_by_kind={"delays": 4, "ENOSPC": 1},
        acknowledged=10,
        excluded={"deleted by retention": 2},
        not_measured=["writes_outside"],
    )
    path = tmp_path / "r.json"
    full.write(path)
    assert HarnessResult.read(path) == full
    ran_nothing.write(path)
    assert HarnessResult.read(path) == ran_nothing
    with pytest.raises(ValueError, match="unknown never-events"):
        HarnessResult("h", "w", not_measured=["typo"])


def test_row_shows_kinds_exclusions_and_what_is_not_measured() -> None:
    result = HarnessResult(
        "chaos",
        "faults",
        cases=1_500,
        survived=1_500,
        cases_by_kind={"delays of 0.5 ms (no error)": 1_200, "ENOSPC part-way": 300},
        acknowledged=400,
        excluded={"destroyed by a torn write": 9, "deleted by retention": 0},
        command="rerun",
    )
    row = runner.render_row(runner.Outcome("chaos", result=result), "ci")
    assert row == (
        "| `chaos` (ci) | faults | 1,500: delays of 0.5 ms (no error) 1,200; ENOSPC part-way 300 "
        "| 1,500 | 0 | 0 of 400 acknowledged | 9 destroyed by a torn write | 0 | 0.0 | `rerun` |"
    )
    fuzz = HarnessResult(
        "fuzz",
        "inputs",
        cases=8,
        survived=8,
        cases_by_kind={"a": 2, "b": 2, "c": 2, "d": 2},
        not_measured=["lost_acknowledged"],
    )
    cells = runner._cells_of(runner.render_row(runner.Outcome("fuzz", result=fuzz), "soak"))
    assert cells[2] == "8: 4 kinds, 2 each (a, b, c, d)"
    assert (cells[5], cells[6]) == ("n/a", "-")


def test_rows_of_the_old_layout_get_the_exclusions_caveat() -> None:
    old = "| `chaos` (soak) | tried \\| it | 10 | 10 | 0 | 0 | 0 | 6.0 | `rerun` |"
    new = runner.upgrade_row(old)
    cells = runner._cells_of(new)
    assert len(cells) == runner.COLUMNS
    assert cells[1:3] == ["tried \\| it", "10 (by kind: not recorded)"]
    assert cells[5:8] == ["0", runner._OLD_EXCLUDED_CELL, "0"]
    assert runner.upgrade_row(new) == new
