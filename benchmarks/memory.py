"""Memory of repeated async saves, in a fresh process: peak RSS and its growth.

The parent runs ``python -m benchmarks.memory --size N --dir D`` and reads one JSON
line back. The child builds the state, then makes ``--saves`` async saves of it
(a new step each, waiting for each to finish, the previous step's directory
removed so the disk does not fill) and samples ``VmRSS`` and ``VmHWM`` after each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import mouthguard_ops as ops
from benchmarks.state import MIB, REPO, build_state, child_pythonpath, proc_status_kib

SAVES = 20
#: Growth from save 5 to the last save that still counts as flat.
FLAT_MIB = 32
#: Allowed peak RSS beyond the state and one staging copy (a target of the report).
OVERHEAD_MIB = 256


@dataclass
class Memory:
    """What the child reported (sizes in bytes), or why it could not run."""

    nbytes: int
    unavailable: str = ""
    baseline: int = 0  # RSS once the interpreter, torch and mouthguard are imported
    with_state: int = 0  # RSS once the state is built
    rss: list[int] = field(default_factory=list)  # VmRSS after each save
    hwm: list[int] = field(default_factory=list)  # VmHWM after each save
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.unavailable and bool(self.hwm)

    @property
    def peak(self) -> int:
        return max(self.hwm)

    @property
    def overhead(self) -> int:
        """Peak RSS minus the interpreter's baseline, the state and one staging copy."""
        return self.peak - self.baseline - 2 * self.nbytes

    @property
    def overhead_with_interpreter(self) -> int:
        """Peak RSS minus the state and one staging copy (the interpreter counted in)."""
        return self.peak - 2 * self.nbytes

    @property
    def growth(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) after the last save minus after save 5 (or the first, if fewer)."""
        i = min(4, len(self.rss) - 1)
        return self.rss[-1] - self.rss[i], self.hwm[-1] - self.hwm[i]

    @property
    def flat(self) -> bool:
        return max(self.growth) <= FLAT_MIB * MIB


def measure(nbytes: int, root: Path, saves: int = SAVES, timeout: float = 900) -> Memory:
    """Run the child for a state of ``nbytes`` writing under ``root``; never raises."""
    d = root / "memory"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cmd = [sys.executable, "-m", "benchmarks.memory", "--size", str(nbytes), "--dir", str(d)]
    cmd += ["--saves", str(saves)]
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Memory(nbytes, unavailable=f"the child ran past {timeout:.0f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Memory(nbytes, unavailable=f"the child failed (rc {proc.returncode}): {tail}")
    got = json.loads(lines[-1])
    return Memory(
        nbytes,
        unavailable=got.get("unavailable", ""),
        baseline=got.get("baseline", 0),
        with_state=got.get("with_state", 0),
        rss=got.get("rss", []),
        hwm=got.get("hwm", []),
        seconds=got.get("seconds", 0.0),
    )


def child(nbytes: int, d: Path, saves: int) -> dict[str, object]:
    def sample(name: str) -> int:
        return proc_status_kib(name)[name] * 1024

    baseline = sample("VmRSS")  # interpreter, torch and mouthguard imported
    state = build_state(nbytes)
    with_state = sample("VmRSS")
    out: dict[str, object] = {"baseline": baseline, "with_state": with_state}
    if not ops.has_save_async():
        out["unavailable"] = "`Checkpointer.save_async` does not exist yet"
        return out
    ckpt = ops.checkpointer(d)
    rss: list[int] = []
    hwm: list[int] = []
    t0 = time.perf_counter()
    try:
        for step in range(1, saves + 1):
            ckpt.save_async(step, state, importance="routine").result()
            shutil.rmtree(ops.step_path(d, step - 1), ignore_errors=True)
            now = proc_status_kib("VmRSS", "VmHWM")
            rss.append(now["VmRSS"] * 1024)
            hwm.append(now["VmHWM"] * 1024)
    except Exception as exc:  # noqa: BLE001 - an API being built: report, do not crash
        out["unavailable"] = ops.describe_error(exc)
        return out
    finally:
        ckpt.close()
    out.update(rss=rss, hwm=hwm, seconds=time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    parser.add_argument("--size", type=int, required=True, help="state size in bytes")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--saves", type=int, default=SAVES)
    args = parser.parse_args()
    print(json.dumps(child(args.size, args.dir, args.saves)))


if __name__ == "__main__":
    main()
