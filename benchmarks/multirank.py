"""Files per checkpoint of a 2-rank ``torch.distributed`` (gloo, loopback) mouthguard save.

The parent starts ``python -m benchmarks.multirank --rank R ...`` once per rank.
Each rank joins the process group and calls ``Checkpointer.save`` on its own state
(the Checkpointer sees the initialised group and saves collectively); the parent
then counts the files in the committed step directory. The goal is world_size + 1:
one rank file per rank and the manifest, never a file per tensor.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import mouthguard_ops as ops
from benchmarks.state import MIB, REPO, build_state, child_pythonpath

WORLD_SIZE = 2
RANK_BYTES = 4 * MIB  # the count does not depend on the size


@dataclass
class Files:
    world_size: int = WORLD_SIZE
    names: list[str] = field(default_factory=list)
    unavailable: str = ""

    @property
    def ok(self) -> bool:
        return not self.unavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def measure(root: Path, timeout: float = 120) -> Files:
    """Run the ranks, then count what the save committed; never raises."""
    d = root / "multirank"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "GLOO_SOCKET_IFNAME": "lo"}
    child_cmd = [sys.executable, "-m", "benchmarks.multirank", "--world", str(WORLD_SIZE)]
    procs = [
        subprocess.Popen(
            [*child_cmd, "--rank", str(rank), "--port", str(port), "--dir", str(d)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    try:
        return _collect(procs, d, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)


def _collect(procs: list[subprocess.Popen[str]], d: Path, timeout: float) -> Files:
    errors = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return Files(unavailable=f"rank {rank} ran past {timeout:.0f} s")
        lines = out.strip().splitlines()
        got = json.loads(lines[-1]) if lines else {}
        if p.returncode != 0 or not got.get("ok"):
            tail = (err.strip().splitlines() or ["no output"])[-1]
            errors.append(f"rank {rank}: {got.get('error') or tail}")
    if errors:
        return Files(unavailable="; ".join(errors))
    step = ops.step_path(d, 1)
    manifest = step / "manifest.json"
    if not manifest.is_file():
        return Files(unavailable="no committed step directory after the save")
    world = json.loads(manifest.read_text()).get("world_size")
    if world != WORLD_SIZE:
        return Files(unavailable=f"the save was not collective (manifest world_size {world})")
    return Files(names=sorted(p.name for p in step.iterdir() if p.is_file()))


def child(rank: int, world: int, port: int, d: Path) -> dict[str, object]:
    import torch.distributed as dist  # noqa: PLC0415 - only the ranks need it

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=dt.timedelta(seconds=60),
    )
    try:
        state = build_state(RANK_BYTES, seed=rank)
        dist.barrier()
        ckpt = ops.checkpointer(d)
        try:
            ckpt.save(1, state)
        finally:
            ckpt.close()
    except Exception as exc:  # noqa: BLE001 - an API being built: report, do not crash
        return {"ok": False, "error": ops.describe_error(exc)}
    finally:
        dist.destroy_process_group()
    return {"ok": True}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multirank")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=WORLD_SIZE)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    print(json.dumps(child(args.rank, args.world, args.port, args.dir)))


if __name__ == "__main__":
    main()
