"""Fuzz harness: hostile and broken input for every parser, and end to end in a watched sandbox.

What is driven (targets, see :mod:`reliability.fuzz_targets` and :mod:`reliability.fuzz_e2e`):

* ``manifest`` -- :func:`~mouthguard.format.manifest.parse_manifest` (``ManifestError`` only)
* ``unseal`` -- :func:`~mouthguard.format.sealed.unseal` of manifests and sidecars (``FormatError``)
* ``sidecar`` -- every sidecar kind through the sidecar readers (``read_sidecars`` never
  raises; a damaged hold still holds, a damaged trash mark keeps the copy in the trash,
  a damaged receipt never vouches)
* ``rank_header`` -- :func:`~mouthguard.format.rank_file.parse_header` (``RankFileError``),
  differential against the safetensors library for every header accepted
* ``typed_json`` -- ``loads_strict``, ``decode``, ``tensor_references``, ``unflatten_state``
* ``dcp_metadata`` -- :func:`~mouthguard.dcp.metadata_json.decode_metadata` (``ManifestError``)
* ``keys`` -- key validation and the local tier's key-to-path mapping (never outside the root)
* ``reader`` -- read_manifest, verify_copy and load_copy of every rank on a memory tier
* ``e2e`` -- the same damage in a real two-tier local store: list, load, verify,
  replicate, collect garbage, with the store inside a sandbox whose outside (canaries,
  a valid checkpoint, FIFOs) is watched with inotify
* ``symlink`` -- links planted in the tier roots pointing outside (to a valid checkpoint,
  to canaries, to FIFOs, to ``/``): never followed

Inputs start from real saves (:mod:`reliability.fuzz_seeds`) and are mutated by bytes
(flips, truncations, insertions, random), by JSON structure (type swaps, huge and
negative numbers, duplicate keys, deep nesting, ``../`` and absolute names, NUL
bytes, unicode tricks) and re-sealed with a valid checksum so the deeper validation
is reached; some are plain random bytes.

Each input is a *case*. A case survives when the code under test accepts it (and the
oracle agrees: a load returns exactly the bytes safetensors finds) or raises the
documented error. Anything else is a failure: another exception (a crash), a case
using more CPU time than its limit (1 s for a parser, 5 s end to end: CPU rather than
wall-clock time, so a busy machine does not turn a case into a failure), an allocation
beyond the worker's address-space limit, or a read or write outside the store.

The cases run in a worker subprocess (``python -m reliability.fuzz --worker``,
:mod:`reliability.fuzz_worker`) under
``RLIMIT_AS`` (its size after setup plus 2 GiB), so an unbounded allocation fails
instead of swapping, and under a watchdog: a case that makes no progress for 30 s
(a blocked FIFO open, an endless loop) is killed, reported, and the run goes on
from the next case in a fresh worker, as it does after a worker that died.

Coverage-guided fuzzing: ``atheris`` installs from a binary wheel on this machine
(``pip install atheris``: atheris 3.0.0, cp311 manylinux wheel, about 2 s) and runs;
it is optional and not a dependency. ``python -m reliability.fuzz_atheris`` runs
the same parsers under libFuzzer's coverage feedback when it is importable.

Rerun: ``python -m reliability.run --only fuzz --level ci`` (or ``python -m
reliability.fuzz --level ci``). A failing case is written under the run's findings
directory (its parts and ``case.json``) and replayed with ``python -m reliability.fuzz
--replay DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reliability.fuzz_worker import (
    MEMORY_HEADROOM,
    PROGRESS,
    SLOW_DEFAULT,
    SLOW_SECONDS,
    Worker,
    locate,
    replay,
    save_case,  # noqa: F401 - still importable from here
)
from reliability.record import HarnessResult, Level

COMMAND = ".venv/bin/python -m reliability.run --level {level} --only fuzz"
#: cases per target and level; ``symlink`` is the fixed list of link scenarios.
PLANS: dict[str, dict[str, int]] = {
    "ci": {
        "manifest": 700,
        "unseal": 200,
        "sidecar": 400,
        "rank_header": 500,
        "typed_json": 400,
        "dcp_metadata": 300,
        "keys": 300,
        "reader": 400,
        "e2e": 100,
        "symlink": 10,
    },
    "soak": {
        "manifest": 60_000,
        "unseal": 20_000,
        "sidecar": 30_000,
        "rank_header": 50_000,
        "typed_json": 40_000,
        "dcp_metadata": 30_000,
        "keys": 30_000,
        "reader": 40_000,
        "e2e": 3_000,
        "symlink": 10,
    },
}
WATCHDOG_SECONDS = 30.0
_MAX_REPORTED = 20


# --- the parent: spawn, watch, restart -----------------------------------------------


def _spawn(spec: dict[str, Any], spec_path: Path) -> subprocess.Popen[bytes]:
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(root), str(root / "src"), env.get("PYTHONPATH", "")] if p
    )
    return subprocess.Popen(
        [sys.executable, "-m", "reliability.fuzz", "--worker", str(spec_path)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(spec_path.with_suffix(".stderr"), "wb"),
    )


def _progress(path: Path) -> tuple[int, float]:
    index, started = PROGRESS.unpack(path.read_bytes()[: PROGRESS.size])
    return int(index), float(started)


def _read_result(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def run(
    level: Level = "ci",
    *,
    seed: int = 0,
    keep: Path | None = None,
    plan: dict[str, int] | None = None,
    watchdog: float = WATCHDOG_SECONDS,
) -> HarnessResult:
    """Fuzz every parser and the end-to-end paths; see the module docstring.

    Args:
        level: ``ci`` (seconds) or ``soak`` (minutes).
        seed: varies every generated case.
        keep: keep the failing cases in this directory (default: a temporary one).
        plan: cases per target instead of the level's (tests use ``selftest``).
        watchdog: seconds without progress after which a case counts as a hang.
    """
    from reliability.fuzz_seeds import build_seeds, save_seeds  # noqa: PLC0415

    started = time.monotonic()
    plan = plan or PLANS[level]
    total = sum(plan.values())
    work = Path(tempfile.mkdtemp(prefix="mouthguard-fuzz-"))
    findings = keep or (work / "findings")
    seeds_path = work / "seeds.json"
    save_seeds(build_seeds(work / "seeds"), seeds_path)
    progress = work / "progress"
    merged: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    writes: set[str] = set()
    skip: list[int] = []
    dump: list[int] = []
    start, attempt = 0, 0
    try:
        while start < total:
            attempt += 1
            spec = {
                "plan": plan,
                "seed": seed,
                "start": start,
                "skip": skip,
                "dump": dump,
                "workdir": str(work / f"w{attempt}"),
                "findings": str(findings),
                "seeds": str(seeds_path),
                "progress": str(progress),
                "result": str(work / f"result-{attempt}.json"),
            }
            result, died = _run_worker(spec, work, attempt, watchdog)
            dump = []
            _merge(merged, result["targets"])
            failures.extend(result["failures"])
            writes.update(result.get("writes_outside", []))
            if result.get("complete"):
                break
            index, _ = _progress(progress)
            if index < 0 or attempt > 50:
                failures.append({"index": -1, "target": "worker", "mode": "", "problem": died})
                break
            _count_the_killer(plan, index, died, findings, merged, failures)
            skip.append(index)
            dump.append(index)
            start = int(result["next"])
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return _result(level, seed, started, merged, failures, writes, attempt)


def _run_worker(
    spec: dict[str, Any], work: Path, attempt: int, watchdog: float
) -> tuple[dict[str, Any], str]:
    """Run one worker from ``spec["start"]`` until it finishes, dies or hangs.

    Returns what it reported (an empty report starting where it started, if it
    wrote none) and, when it did not complete, why it stopped: killed by the
    watchdog, or its exit status and the tail of its stderr ("" when it completed).
    """
    progress = Path(spec["progress"])
    progress.write_bytes(PROGRESS.pack(-1, time.monotonic()))
    proc = _spawn(spec, work / f"spec-{attempt}.json")
    died = _watch(proc, progress, watchdog)
    empty = {"next": spec["start"], "targets": {}, "failures": []}
    result = _read_result(Path(spec["result"])) or empty
    if died is None and not result.get("complete"):
        stderr = (work / f"spec-{attempt}.stderr").read_text(errors="replace")[-400:]
        died = f"crash: worker exited with {proc.returncode}: {stderr.strip()}"
    return result, died or ""


def _count_the_killer(
    plan: dict[str, int],
    index: int,
    died: str,
    findings: Path,
    merged: dict[str, dict[str, Any]],
    failures: list[dict[str, Any]],
) -> None:
    """Record case ``index``, which crashed or hung its worker, as a failed case of its target."""
    target, _ = locate(plan, index)
    failures.append(
        {
            "index": index,
            "target": target,
            "mode": "",
            "problem": died,
            "replay": str(findings / f"case-{index}"),
        }
    )
    stats = merged.setdefault(
        target, {"cases": 0, "survived": 0, "accepted_corrupt": 0, "max_seconds": 0.0}
    )
    stats["cases"] += 1


def _watch(proc: subprocess.Popen[bytes], progress: Path, watchdog: float) -> str | None:
    """Wait for a worker; kill it when a case makes no progress for ``watchdog`` seconds.

    Returns why it was killed (None: it exited by itself).
    """
    died: str | None = None
    while proc.poll() is None:
        time.sleep(0.05)
        index, since = _progress(progress)
        if index >= 0 and time.monotonic() - since > watchdog:
            proc.kill()
            proc.wait()
            died = f"hang: no progress for {watchdog:.0f} s (killed)"
    return died


def _merge(merged: dict[str, dict[str, Any]], targets: dict[str, dict[str, Any]]) -> None:
    """Add one worker's per-target counts to ``merged`` (``max_seconds``: the maximum)."""
    for target, stats in targets.items():
        into = merged.setdefault(target, dict.fromkeys(stats, 0))
        for key, value in stats.items():
            into[key] = max(into[key], value) if key == "max_seconds" else into[key] + value


def _result(
    level: Level,
    seed: int,
    started: float,
    merged: dict[str, dict[str, Any]],
    failures: list[dict[str, Any]],
    writes: set[str],
    attempt: int,
) -> HarnessResult:
    cases = sum(int(s["cases"]) for s in merged.values())
    survived = sum(int(s["survived"]) for s in merged.values())
    corrupt = sum(int(s["accepted_corrupt"]) for s in merged.values())
    return HarnessResult(
        harness="fuzz",
        what=(
            "structure-aware mutations (bytes, JSON type swaps, huge/negative numbers, "
            "duplicate keys, deep nesting, ../ and absolute names, NUL, unicode; re-sealed) "
            "and random bytes into the manifest, sidecar, rank-file, typed-JSON, DCP-metadata "
            "and key parsers and the read path; end to end in a real store inside a "
            "watched sandbox, with links planted to the outside"
        ),
        cases=cases,
        survived=survived,
        accepted_corrupt=corrupt,
        writes_outside=len(writes),
        cases_by_kind={target: int(stats["cases"]) for target, stats in sorted(merged.items())},
        not_measured=["lost_acknowledged"],  # parsers and reads: nothing is saved
        command=COMMAND.format(level=level),
        seconds=round(time.monotonic() - started, 2),
        details={
            "seed": seed,
            "by_target": merged,
            "failure_kinds": _kinds(failures),
            "failures": failures[:_MAX_REPORTED],
            "failure_count": len(failures),
            "writes_outside": sorted(writes)[:_MAX_REPORTED],
            "workers": attempt,
            "limits": {
                "slow_seconds": {**SLOW_SECONDS, "other": SLOW_DEFAULT},
                "watchdog_seconds": WATCHDOG_SECONDS,
                "address_space_headroom_bytes": MEMORY_HEADROOM,
            },
        },
    )


def _kinds(failures: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Failures grouped by target and problem (digits and quoted values blurred)."""
    out: dict[str, dict[str, Any]] = {}
    for failure in failures:
        blurred = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", str(failure["problem"]))[:90]
        entry = out.setdefault(
            f"{failure['target']}: {blurred}", {"count": 0, "example": failure.get("replay", "")}
        )
        entry["count"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.fuzz", description=__doc__)
    parser.add_argument("--level", choices=["ci", "soak"], default="ci")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep failing cases in this directory")
    parser.add_argument("--replay", type=Path, help="rerun one saved case")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        Worker(json.loads(args.worker.read_text())).run()
        return 0
    if args.replay is not None:
        problem = replay(args.replay)
        print(problem or "survives")
        return 0 if problem is None else 1
    level: Level = "soak" if args.level == "soak" else "ci"
    result = run(level, seed=args.seed, keep=args.keep)
    print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
