"""Chaos harness: every job of a two-tier store through fault-injecting tiers.

Rounds of ``save`` / ``save_async`` / ``load`` / replication / retention / gc
run against a fresh two-tier store (local ``fast`` and ``durable`` in distinct
failure domains) whose tiers are wrapped in
:class:`~mouthguard.tiers.faults.FaultyTier` with a mix of I/O errors, ENOSPC,
torn and short writes acknowledged by the storage, failed fsyncs, bit flips on
read and delays. After every round the invariants are judged through the
unwrapped tiers (:mod:`mouthguard.chaos`), and at the end the whole
sandbox directory is walked for files outside the two tier roots.

One case is one injected fault; it survived when every invariant held in its
round. Most cases are cheap ones (short delays, ENOSPC): the result breaks the
cases down by kind, so a large total is never read as that many hard faults.
Acknowledged saves that are gone but are not counted as lost are counted apart,
with the reason: deleted by retention (the policy asked), or destroyed by a torn
or short write that the storage itself acknowledged while the save was being
written (no intact copy ever existed; this is what a checksum catches at load,
and what no software above the storage can prevent).

Rerun: ``python -m reliability.run --only chaos --level ci`` (or
``python -m reliability.chaos --level soak --seed N``).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import mouthguard
from mouthguard.chaos import DEFAULT_FAULTS, ChaosReport, run_chaos
from mouthguard.tiers.faults import FaultPlan
from reliability.record import HarnessResult, Level

#: The fault mix: the one ``mouthguard chaos`` injects by default.
FAULTS = DEFAULT_FAULTS
#: How the table words each fault kind (``{ms}``: the plan's delay).
FAULT_LABELS = {
    "delay": "delays of {ms:g} ms (no error)",
    "enospc": "ENOSPC part-way through a write",
    "fsync": "failed fsyncs after a write",
    "error": "I/O errors",
    "torn": "torn writes acknowledged by the storage",
    "short": "short writes acknowledged by the storage",
    "flip": "bit flips on read",
}
LOST_TO_STORAGE = (
    "destroyed by a torn or short write the storage acknowledged while the save "
    "was being written (no intact copy ever existed)"
)
DELETED_BY_POLICY = "deleted by retention, as the policy asks"


@dataclass(frozen=True)
class Params:
    """One level's bounds."""

    rounds: int
    max_seconds: float
    seed: int


LEVELS: dict[Level, Params] = {
    "ci": Params(rounds=400, max_seconds=10.0, seed=1),
    "soak": Params(rounds=1_000_000, max_seconds=600.0, seed=7),
}


def files_outside(sandbox: Path, roots: list[Path]) -> list[str]:
    """Files under ``sandbox`` that are not under one of ``roots``."""
    return sorted(
        str(path.relative_to(sandbox))
        for path in sandbox.rglob("*")
        if not path.is_dir() and not any(path.is_relative_to(root) for root in roots)
    )


def run(level: Level = "ci", *, seed: int | None = None) -> HarnessResult:
    """Run the chaos harness at ``level`` (``seed`` overrides the level's)."""
    params = LEVELS[level]
    seed = params.seed if seed is None else seed
    command = "python -m reliability.run --only chaos --level " + level
    if seed != params.seed:
        command = f"python -m reliability.chaos --level {level} --seed {seed}"
    started = time.monotonic()
    logging.getLogger("mouthguard").setLevel(logging.CRITICAL)  # faults are expected noise
    with tempfile.TemporaryDirectory(prefix="mouthguard-chaos-") as tmp:
        sandbox = Path(tmp)
        store = mouthguard.open_store(sandbox / "store")
        roots = [Path(tier.location()) for tier in store.tiers]
        report = run_chaos(
            store,
            rounds=params.rounds,
            plan=FaultPlan.parse(FAULTS),
            seed=seed,
            run="chaos",
            max_seconds=params.max_seconds,
        )
        outside = files_outside(sandbox, roots)
    return _result(report, outside, level, command, time.monotonic() - started)


def faults_by_kind(injected: dict[str, int], plan: FaultPlan) -> dict[str, int]:
    """Injected faults by kind, worded for the table, most frequent first."""
    ms = plan.delay_seconds * 1000
    named = {FAULT_LABELS.get(k, k).format(ms=ms): n for k, n in injected.items() if n}
    return dict(sorted(named.items(), key=lambda item: (-item[1], item[0])))


def _result(
    report: ChaosReport, outside: list[str], level: Level, command: str, seconds: float
) -> HarnessResult:
    failures = list(report.failures)
    if outside:
        failures.append(f"files outside the tier roots: {outside[:10]}")
    return HarnessResult(
        harness="chaos",
        what=(
            "save, save_async, load, replication, retention and gc on a two-tier store "
            "whose tiers inject I/O errors, ENOSPC, torn and short writes acknowledged "
            "by the storage, failed fsyncs, bit flips on read and delays (seeded); "
            "invariants judged through the unwrapped tiers after every round (no "
            "acknowledged save lost, no wrong bytes accepted, no intact copy set aside, "
            "no receipt on bytes that fail verification); one case is one injected fault"
        ),
        cases=report.cases,
        cases_by_kind=faults_by_kind(report.injected, FaultPlan.parse(report.plan)),
        acknowledged=report.acknowledged,
        excluded={
            LOST_TO_STORAGE: report.lost_to_storage,
            DELETED_BY_POLICY: report.deleted_by_policy,
        },
        survived=report.survived if not outside else 0,
        accepted_corrupt=report.accepted_corrupt,
        lost_acknowledged=report.lost_acknowledged,
        writes_outside=report.writes_outside + len(outside),
        command=command,
        seconds=round(seconds, 1),
        details={
            "level": level,
            "seed": report.seed,
            "faults": report.plan,
            "injected": dict(sorted(report.injected.items())),
            "rounds": report.rounds,
            "rounds_ok": report.rounds_ok,
            "saves": report.saves,
            "saves_acknowledged": report.acknowledged,
            "save_errors": dict(sorted(report.save_errors.items())),
            "failed_saves_visible": report.failed_but_visible,
            "loads": report.loads,
            "load_fallbacks": report.load_fallbacks,
            "load_errors": dict(sorted(report.load_errors.items())),
            "job_pass_errors": dict(sorted(report.pass_errors.items())),
            "acknowledged_deleted_by_policy": report.deleted_by_policy,
            "acknowledged_lost_to_storage": report.lost_to_storage,
            "listed_but_unloadable": report.listed_damaged,
            "crashes": report.crashes,
            # Damage rules, judged through the unwrapped tiers: copies set aside
            # that verify intact, receipts on bytes that do not verify.
            "set_aside_judged": report.set_aside,
            "false_damage": report.false_damage,
            "receipts_judged": report.receipts_checked,
            "false_receipt": report.false_receipt,
            "failures": failures[:30],
        },
    )


def main() -> None:
    """``python -m reliability.chaos [--level ci|soak] [--seed N] [--json PATH]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", choices=sorted(LEVELS), default="ci")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    result = run(args.level, seed=args.seed)
    if args.json is not None:
        result.write(args.json)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
