"""One rank of the rank-death harness: resume, save once cleanly, save again -- maybe die in it.

:func:`rank_main` runs in a process forked from a server that has torch and
mouthguard imported already (the harness starts four per case). It joins the
gloo group through the parent's ``TCPStore``, resumes from the newest
checkpoint (reporting whether its part is byte-exact), saves step ``n`` and
then step ``n + 1``. The *victim* rank arms its plan before the second save and
SIGKILLs itself at the planned point: inside a checkpoint collective, before or
in the middle of writing its rank file, around the coordinator's publish, or at
a random moment -- or, for a ``stop`` plan, SIGSTOPs itself before one of the
collectives and stays alive and silent until the harness kills it. Every event
goes to the parent as one small message on a pipe (atomic: a kill never leaves
half a message).

Events: ``("ready",)``, ``("resumed", step | None, exact)``, ``("acked", step)``,
``("saving", step, collectives_in_a_clean_save)``, ``("raised", step, error class,
message, seconds from the start of the save to the error)``, ``("crashed",
traceback)``.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import mouthguard
from mouthguard.checkpoint.ranks import TorchRanks
from mouthguard.errors import MouthguardError
from mouthguard.tiers.local import LocalTier
from reliability.crash_worker import same_state

RUN = "rankdeath"
#: float32 elements of each rank's shard (1 MiB: long enough to be cut mid-write).
ELEMENTS = 256 * 1024

Plan = tuple[str, float]  # (kind, parameter: collective number or delay fraction)


def shard(step: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s part of the state at ``step`` (the checker recomputes it)."""
    return {
        "w": torch.arange(ELEMENTS, dtype=torch.float32) + step * 10 + rank,
        "meta": {"step": step, "rank": rank},
    }


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _stop() -> None:
    """Stop this process (SIGSTOP): alive, its sockets open, silent -- only a timeout ends
    the peers' wait. The harness SIGKILLs it once they have all given up."""
    os.kill(os.getpid(), signal.SIGSTOP)


class _Counter:
    """Counts this process's checkpoint collectives; can die (or stop) before the n-th."""

    def __init__(self) -> None:
        self.calls = 0
        self.die_at = 0  # 0: never
        self.end = _die
        real = TorchRanks._all_gather

        def counted(ranks: TorchRanks, value: Any) -> Any:
            self.calls += 1
            if self.calls == self.die_at:
                self.end()
            return real(ranks, value)

        TorchRanks._all_gather = counted  # type: ignore[method-assign,assignment]


def _arm(kind: str, param: float, counter: _Counter, save_seconds: float) -> None:
    """Make this process SIGKILL itself at the planned point of the next save."""
    if kind == "collective":
        counter.die_at = counter.calls + int(param)
    elif kind == "stop":
        counter.die_at, counter.end = counter.calls + int(param), _stop
    elif kind == "before_file":
        real_put = LocalTier.put

        def put(tier: LocalTier, key: str, data: Any, **kw: Any) -> Any:
            if key.endswith(".safetensors"):
                _die()
            return real_put(tier, key, data, **kw)

        LocalTier.put = put  # type: ignore[method-assign,assignment]
    elif kind == "mid_file":
        real_pwrite = os.pwrite

        def pwrite(fd: int, data: Any, offset: int) -> int:
            view = memoryview(data).cast("B")
            if view.nbytes >= 64 * 1024:
                real_pwrite(fd, view[: view.nbytes // 2], offset)  # half of it lands
                _die()
            return real_pwrite(fd, data, offset)

        os.pwrite = pwrite
    elif kind in ("before_publish", "after_publish"):
        real_rename = LocalTier.rename_prefix

        def rename_prefix(tier: LocalTier, src: str, dst: str) -> None:
            if kind == "before_publish":
                _die()
            real_rename(tier, src, dst)
            _die()  # committed, never acknowledged

        LocalTier.rename_prefix = rename_prefix  # type: ignore[method-assign,assignment]
    elif kind == "timer":
        timer = threading.Timer(param * save_seconds, _die)
        timer.daemon = True
        timer.start()
    else:
        raise ValueError(f"unknown kill plan {kind!r}")


def rank_main(
    store_dir: str, rank: int, world: int, port: int, plan: Plan | None, timeout: float, out: Any
) -> None:
    """One rank's life; see the module docstring. Never returns normally: ``os._exit``."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    counter = _Counter()
    try:
        limit = dt.timedelta(seconds=timeout)
        tcp = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not re-exported for mypy
            "127.0.0.1", port, world, is_master=False, timeout=limit
        )
        dist.init_process_group("gloo", store=tcp, rank=rank, world_size=world, timeout=limit)
        store = mouthguard.open_store(Path(store_dir))
        ckpt = mouthguard.Checkpointer(store, RUN, background=False, collective_timeout=timeout)
        out.send(("ready",))
        resumed = None
        if ckpt.steps():
            loaded = ckpt.load()
            resumed = loaded.step
            out.send(("resumed", resumed, same_state(loaded.state, shard(resumed, rank))))
        else:
            out.send(("resumed", None, True))
        step = 0 if resumed is None else resumed + 1
        before, started = counter.calls, time.monotonic()
        ckpt.save(step, shard(step, rank))
        clean_seconds, collectives = time.monotonic() - started, counter.calls - before
        out.send(("acked", step))
        out.send(("saving", step + 1, collectives))
        if plan is not None:
            _arm(plan[0], plan[1], counter, clean_seconds)
        started = time.monotonic()
        try:
            ckpt.save(step + 1, shard(step + 1, rank))
        except MouthguardError as exc:
            elapsed = time.monotonic() - started
            out.send(("raised", step + 1, type(exc).__name__, str(exc)[:400], elapsed))
        else:
            out.send(("acked", step + 1))
        if plan is not None and plan[0] == "timer":
            time.sleep(timeout)  # the save beat the timer: the death lands just after it
    except BaseException:
        out.send(("crashed", traceback.format_exc()[-2000:]))
    finally:
        out.close()
        # A broken process group can hang its own teardown: leave without it.
        os._exit(0)


def stop_plan(rng: random.Random, collectives: int) -> Plan:
    """A stop point: the victim SIGSTOPs itself before one of the save's collectives."""
    return ("stop", float(rng.randint(1, max(1, collectives))))


def random_plan(rng: random.Random, collectives: int) -> Plan:
    """A kill point: a collective of the save, the file, the publish, or a random moment."""
    roll = rng.random()
    if roll < 0.35:
        return ("collective", float(rng.randint(1, max(1, collectives))))
    if roll < 0.5:
        return ("before_file", 0.0)
    if roll < 0.65:
        return ("mid_file", 0.0)
    if roll < 0.8:
        return (rng.choice(["before_publish", "after_publish"]), 0.0)
    return ("timer", rng.uniform(0.0, 1.5))
