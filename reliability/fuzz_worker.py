"""The fuzz harness's worker: runs cases in a child process, saves and replays them.

The parent (:mod:`reliability.fuzz`) starts it as ``python -m reliability.fuzz
--worker SPEC`` and watches the progress record it keeps in :data:`PROGRESS`; a
case's CPU-time limit, the address-space headroom and the saved-case format are
here, where they are enforced.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import resource
import shutil
import signal
import struct
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

SLOW_SECONDS = {"e2e": 5.0, "symlink": 10.0}
SLOW_DEFAULT = 1.0
MEMORY_HEADROOM = 2 << 30
PROGRESS = struct.Struct("qd")  # case index, monotonic start time
_FLUSH_SECONDS = 1.0
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


class Worker:
    """Runs the cases of ``spec`` from ``spec["start"]``, recording each (see :meth:`run`)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch  # noqa: PLC0415 - the worker's own import, after the env is set

        from reliability import fuzz_case, fuzz_e2e, fuzz_targets  # noqa: PLC0415
        from reliability.fuzz_seeds import load_seeds  # noqa: PLC0415

        torch.set_num_threads(1)
        self.spec = spec
        self.plan: dict[str, int] = spec["plan"]
        self.workdir = Path(spec["workdir"])
        self.findings = Path(spec["findings"])
        seeds = load_seeds(Path(spec["seeds"]))
        scratch = self.workdir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        self.ctx = fuzz_case.Context(seeds, scratch)
        self.targets = fuzz_targets.TARGETS
        self.e2e_mod = fuzz_e2e
        self.env = fuzz_e2e.setup(self.workdir / f"e2e-{spec['start']}", seeds)
        self.result: dict[str, Any] = {"next": spec["start"], "targets": {}, "failures": []}
        fd = os.open(spec["progress"], os.O_RDWR)
        self.progress = mmap.mmap(fd, PROGRESS.size)
        os.close(fd)

    def make(self, index: int) -> Any:
        from reliability.fuzz_case import Case  # noqa: PLC0415

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
            self.progress[:] = PROGRESS.pack(index, time.monotonic())
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
    from reliability import fuzz_case, fuzz_e2e, fuzz_targets  # noqa: PLC0415
    from reliability.fuzz_seeds import build_seeds, load_seeds  # noqa: PLC0415

    doc = json.loads((directory / "case.json").read_text())
    parts = {name: (directory / file).read_bytes() for name, file in doc["parts"]}
    case = fuzz_case.Case(doc["target"], doc["index"], doc["mode"], parts, doc["meta"])
    work = Path(tempfile.mkdtemp(prefix="mouthguard-replay-"))
    try:
        seeds = load_seeds(seeds_path) if seeds_path else build_seeds(work)
        ctx = fuzz_case.Context(seeds, work / "scratch")
        (work / "scratch").mkdir(exist_ok=True)
        if case.target in ("e2e", "symlink"):
            env = fuzz_e2e.setup(work, seeds)
            check = fuzz_e2e.check_e2e if case.target == "e2e" else fuzz_e2e.check_symlink
            return check(case, ctx, env)
        return fuzz_targets.TARGETS[case.target][1](case, ctx)
    finally:
        shutil.rmtree(work, ignore_errors=True)
