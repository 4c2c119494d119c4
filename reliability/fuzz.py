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

The cases run in a worker subprocess (``python -m reliability.fuzz --worker``) under
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
import mmap
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

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
SLOW_SECONDS = {"e2e": 5.0, "symlink": 10.0}
SLOW_DEFAULT = 1.0
WATCHDOG_SECONDS = 30.0
MEMORY_HEADROOM = 2 << 30
_PROGRESS = struct.Struct("qd")  # case index, monotonic start time
_FLUSH_SECONDS = 1.0
_MAX_REPORTED = 20
_MAX_SAVED = 200


def _order(plan: dict[str, int]) -> list[tuple[str, int]]:
    return list(plan.items())


def locate(plan: dict[str, int], index: int) -> tuple[str, int]:
    """(target, index within the target) of the global case ``index``."""
    for target, count in _order(plan):
        if index < count:
            return target, index
        index -= count
    raise IndexError(index)


# --- the worker ------------------------------------------------------------------


class _Worker:
    def __init__(self, spec: dict[str, Any]) -> None:
        import torch  # noqa: PLC0415 - the worker's own import, after the env is set

        from reliability import fuzz_e2e, fuzz_targets  # noqa: PLC0415
        from reliability.fuzz_seeds import load_seeds  # noqa: PLC0415

        torch.set_num_threads(1)
        self.spec = spec
        self.plan: dict[str, int] = spec["plan"]
        self.workdir = Path(spec["workdir"])
        self.findings = Path(spec["findings"])
        seeds = load_seeds(Path(spec["seeds"]))
        scratch = self.workdir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        self.ctx = fuzz_targets.Context(seeds, scratch)
        self.targets = fuzz_targets.TARGETS
        self.e2e_mod = fuzz_e2e
        self.env = fuzz_e2e.setup(self.workdir / f"e2e-{spec['start']}", seeds)
        self.result: dict[str, Any] = {"next": spec["start"], "targets": {}, "failures": []}
        fd = os.open(spec["progress"], os.O_RDWR)
        self.progress = mmap.mmap(fd, _PROGRESS.size)
        os.close(fd)

    def make(self, index: int) -> Any:
        from reliability.fuzz_targets import Case  # noqa: PLC0415

        target, local = locate(self.plan, index)
        rng = random.Random(f"{self.spec['seed']}:{target}:{local}")
        if target == "symlink":
            names = sorted(self.e2e_mod.SCENARIOS)
            name = names[local % len(names)]
            return Case("symlink", local, "link", {}, {"scenario": name})
        if target == "e2e":
            return self.e2e_mod.make_e2e(rng, self.ctx.seeds, local)
        if target == "selftest":
            kinds = ["pass", "hang", "allocation", "crash", "segfault", "spin", "idle"]
            return Case("selftest", local, kinds[local % len(kinds)], {}, {})
        maker, _ = self.targets[target]
        return maker(rng, self.ctx.seeds, local)

    def check(self, case: Any) -> str | None:
        if case.target == "e2e":
            return self.e2e_mod.check_e2e(case, self.ctx, self.env)
        if case.target == "symlink":
            return self.e2e_mod.check_symlink(case, self.ctx, self.env)
        if case.target == "selftest":
            return self.selftest(case.mode)
        _, checker = self.targets[case.target]
        return checker(case, self.ctx)

    def selftest(self, kind: str) -> str | None:
        """Failures on purpose, to prove the harness sees each kind (see the tests)."""
        if kind == "hang":  # a blocking open of a FIFO nobody writes: only the watchdog helps
            with self.env.sandbox.fifo.open("rb"):
                pass
        elif kind == "allocation":
            bytearray(MEMORY_HEADROOM * 2)
        elif kind == "crash":
            raise KeyError("selftest")
        elif kind == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif kind == "spin":  # burns more CPU than the limit: reported slow
            until = time.process_time() + SLOW_DEFAULT * 1.2
            while time.process_time() < until:
                pass
        elif kind == "idle":  # waits longer than the limit burning nothing: not slow
            time.sleep(SLOW_DEFAULT * 1.2)
        return None

    def limit_memory(self) -> None:
        with Path("/proc/self/statm").open() as statm:
            pages = int(statm.read().split()[0])
        size = pages * resource.getpagesize() + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (size, resource.RLIM_INFINITY))

    def run(self) -> None:
        total = sum(self.plan.values())
        skip = set(self.spec.get("skip", []))
        for index in self.spec.get("dump", []):
            save_case(self.make(index), self.findings / f"case-{index}")
        self.limit_memory()
        last_flush = time.monotonic()
        for index in range(self.spec["start"], total):
            if index in skip:
                self.result["next"] = index + 1
                continue
            self.progress[:] = _PROGRESS.pack(index, time.monotonic())
            case = self.make(index)
            started = time.perf_counter()
            # The slow limit is on CPU time: a parser gone quadratic burns CPU, while a
            # machine busy with other work only stretches the wall clock (hangs that
            # burn nothing, like a blocked open, are the watchdog's).
            cpu_started = time.process_time()
            try:
                problem = self.check(case)
            except MemoryError as exc:
                problem = f"allocation: MemoryError {exc}"
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                kind = "allocation" if "allocate" in str(exc) else "crash"
                problem = (
                    f"{kind}: {type(exc).__name__}: {str(exc)[:300]} "
                    f"(at {Path(where.filename).name}:{where.lineno})"
                )
            seconds = time.perf_counter() - started
            cpu_seconds = time.process_time() - cpu_started
            limit = SLOW_SECONDS.get(case.target, SLOW_DEFAULT)
            if problem is None and cpu_seconds > limit:
                problem = f"slow: {cpu_seconds:.2f} s of CPU (limit {limit} s)"
            self.record(index, case, problem, seconds)
            self.result["next"] = index + 1
            if time.monotonic() - last_flush > _FLUSH_SECONDS:
                self.flush()
                last_flush = time.monotonic()
        self.result["outside_changed"] = self.env.sandbox.finish()
        self.result["writes_outside"] = sorted(self.env.sandbox.written)
        self.result["complete"] = True
        self.flush()

    def record(self, index: int, case: Any, problem: str | None, seconds: float) -> None:
        stats = self.result["targets"].setdefault(
            case.target, {"cases": 0, "survived": 0, "accepted_corrupt": 0, "max_seconds": 0.0}
        )
        stats["cases"] += 1
        stats["max_seconds"] = max(stats["max_seconds"], round(seconds, 4))
        if problem is None:
            stats["survived"] += 1
            return
        if problem.startswith("accepted_corrupt: "):
            stats["accepted_corrupt"] += 1
        directory = self.findings / f"case-{index}"
        if len(self.result["failures"]) < _MAX_SAVED:
            save_case(case, directory)
        self.result["failures"].append(
            {
                "index": index,
                "target": case.target,
                "mode": case.mode,
                "problem": problem,
                "replay": str(directory),
            }
        )

    def flush(self) -> None:
        path = Path(self.spec["result"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result))
        tmp.replace(path)


def save_case(case: Any, directory: Path) -> None:
    """Write a case's parts and description so ``--replay`` can rerun it."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for i, (name, data) in enumerate(case.parts.items()):
        file = f"part-{i}"
        (directory / file).write_bytes(data)
        names.append([name, file])
    (directory / "case.json").write_text(
        json.dumps(
            {
                "target": case.target,
                "index": case.index,
                "mode": case.mode,
                "meta": case.meta,
                "parts": names,
            },
            indent=1,
        )
    )


def replay(directory: Path, seeds_path: Path | None = None) -> str | None:
    """Rerun a saved case in this process; return its problem (None: it survives now)."""
    from reliability import fuzz_e2e, fuzz_targets  # noqa: PLC0415
    from reliability.fuzz_seeds import build_seeds, load_seeds  # noqa: PLC0415

    doc = json.loads((directory / "case.json").read_text())
    parts = {name: (directory / file).read_bytes() for name, file in doc["parts"]}
    case = fuzz_targets.Case(doc["target"], doc["index"], doc["mode"], parts, doc["meta"])
    work = Path(tempfile.mkdtemp(prefix="mouthguard-replay-"))
    try:
        seeds = load_seeds(seeds_path) if seeds_path else build_seeds(work)
        ctx = fuzz_targets.Context(seeds, work / "scratch")
        (work / "scratch").mkdir(exist_ok=True)
        if case.target in ("e2e", "symlink"):
            env = fuzz_e2e.setup(work, seeds)
            check = fuzz_e2e.check_e2e if case.target == "e2e" else fuzz_e2e.check_symlink
            return check(case, ctx, env)
        return fuzz_targets.TARGETS[case.target][1](case, ctx)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    index, started = _PROGRESS.unpack(path.read_bytes()[: _PROGRESS.size])
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
            progress.write_bytes(_PROGRESS.pack(-1, time.monotonic()))
            result_path = work / f"result-{attempt}.json"
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
                "result": str(result_path),
            }
            proc = _spawn(spec, work / f"spec-{attempt}.json")
            dump = []
            died = _watch(proc, progress, watchdog)
            result = _read_result(result_path) or {"next": start, "targets": {}, "failures": []}
            _merge(merged, result["targets"])
            failures.extend(result["failures"])
            writes.update(result.get("writes_outside", []))
            if result.get("complete"):
                break
            index, _ = _progress(progress)
            if died is None:
                stderr = (work / f"spec-{attempt}.stderr").read_text(errors="replace")[-400:]
                died = f"crash: worker exited with {proc.returncode}: {stderr.strip()}"
            if index < 0 or attempt > 50:
                failures.append({"index": -1, "target": "worker", "mode": "", "problem": died})
                break
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
            skip.append(index)
            dump.append(index)
            start = int(result["next"])
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return _result(level, seed, started, merged, failures, writes, attempt)


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
        _Worker(json.loads(args.worker.read_text())).run()
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
