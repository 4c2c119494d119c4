"""One rank of the power-loss harness's multi-rank variant.

``python -m reliability.powerloss_rank STORE LOG RANK WORLD PORT``: joins a gloo
group through the parent's ``TCPStore`` on 127.0.0.1:PORT, then, recording every
file-system mutation under ``STORE`` into ``LOG`` (shared with the other ranks),
saves its shard of steps 3 and 4 with ``Checkpointer.save`` and marks each
acknowledgement. Exits 0 on success.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import torch.distributed as dist

import mouthguard
from reliability.crash_worker import importance_for
from reliability.fsrecord import Recorder
from reliability.powerloss import RUN, STEPS_MULTIRANK, rank_expected


def main(argv: list[str] | None = None) -> int:
    """Join the group, save, leave; see the module docstring."""
    store_dir, log, rank, world, port = (argv or sys.argv[1:])[:5]
    timeout = dt.timedelta(seconds=60)
    tcp = dist.TCPStore(  # type: ignore[attr-defined]  # exported, not re-exported for mypy
        "127.0.0.1", int(port), int(world), is_master=False, timeout=timeout
    )
    me, size = int(rank), int(world)
    dist.init_process_group("gloo", store=tcp, rank=me, world_size=size, timeout=timeout)
    try:
        with Recorder(Path(store_dir), Path(log)) as rec:
            store = mouthguard.open_store(store_dir)
            ckpt = mouthguard.Checkpointer(store, run=RUN, background=False)
            for step in STEPS_MULTIRANK:
                state = rank_expected(step, me, size)
                ckpt.save(step, state, importance=importance_for(step))
                if me == 0:
                    rec.mark(ev="acked", step=step)
            ckpt.close()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
