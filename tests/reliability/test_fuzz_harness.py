"""The fuzz harness at its CI level: every parser, the read path and the sandboxed store."""

from __future__ import annotations

import random

import pytest
from reliability.fuzz_sandbox import Sandbox, make_sandbox

from mouthguard.format.sealed import unseal
from reliability import fuzz
from reliability import fuzz_mutate as mut


@pytest.mark.slow
def test_fuzz_harness_ci_level_survives_every_case() -> None:
    result = fuzz.run("ci")
    assert result.cases >= 3000
    assert set(result.details["by_target"]) == set(fuzz.PLANS["ci"])
    assert result.ok, result.details["failure_kinds"]
    # How long it takes is a benchmark's business (reliability.run reports it), not a test's.


def test_cases_are_located_across_targets_in_plan_order() -> None:
    plan = {"a": 2, "b": 3}
    assert [fuzz.locate(plan, i) for i in range(5)] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    with pytest.raises(IndexError):
        fuzz.locate(plan, 5)


def test_hostile_serialiser_writes_duplicate_keys_and_reseals() -> None:
    doc = mut.Pairs((("a", 1), ("a", mut.Raw("[" * 3 + "]" * 3)), ("s", "\ud800")))
    text = mut.dumps({"x": doc})
    assert '"a": 1' in text and '"a": [[[]]]' in text and "\\ud800" in text
    sealed = mut.seal_text(mut.dumps({"k": [1, 2]}))
    assert unseal(sealed) == {"k": [1, 2]}


def test_json_mutations_are_deterministic_per_seed() -> None:
    doc = {"files": [{"name": "rank-00000.safetensors", "size": 4096}], "step": 1}
    one = mut.dumps(mut.mutate_json(random.Random("s:1"), doc))
    two = mut.dumps(mut.mutate_json(random.Random("s:1"), doc))
    assert one == two
    assert doc == {"files": [{"name": "rank-00000.safetensors", "size": 4096}], "step": 1}


def test_sandbox_watch_sees_reads_and_writes_outside(tmp_path: pytest.TempPathFactory) -> None:
    sandbox: Sandbox = make_sandbox(tmp_path)  # type: ignore[arg-type]
    sandbox.start()
    assert sandbox.events() == []
    (sandbox.store / "fast" / "inside.txt").write_text("inside the tier: not reported")
    assert sandbox.events() == []
    (sandbox.canary / "secret.txt").read_text()
    assert any("secret.txt" in str(e) for e in sandbox.events())
    (sandbox.root / "new.txt").write_text("x")
    assert sandbox.finish() == [str(sandbox.root / "new.txt")]
    assert str(sandbox.root / "new.txt") in sandbox.written


@pytest.mark.slow
def test_harness_reports_hangs_allocations_crashes_and_dead_workers() -> None:
    """Failures made on purpose: a blocked FIFO open, 4 GiB, an exception, SIGSEGV, a spin.

    The slow limit counts CPU time: a case that only waits as long survives (a busy
    machine stretches the wall clock of every case without making any of them slow).
    """
    # The watchdog must outlast the spin's 1.2 s of CPU on a loaded machine, where a
    # second of CPU can take several of wall clock; the FIFO hang costs that long.
    result = fuzz.run("ci", plan={"selftest": 7}, watchdog=15.0)
    assert result.cases == 7
    assert result.survived == 2  # the "pass" and the "idle" cases
    problems = sorted(f["problem"].split(":")[0] for f in result.details["failures"])
    assert problems == ["allocation", "crash", "crash", "hang", "slow"], problems
    assert result.details["workers"] == 3  # restarted after the hang and the SIGSEGV
    assert not result.ok
