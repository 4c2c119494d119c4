"""Child for the preemption test: trains until SIGTERM, then the guard saves and exits."""

from __future__ import annotations

import signal
import sys
import time

import torch

import mouthguard
from mouthguard.checkpoint.emergency import PreemptionGuard


def main() -> None:
    """Train a tiny model until preempted; print each step so the parent can time SIGTERM."""
    store, step_seconds, grace = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    mask_main = sys.argv[4:] == ["mask-main"]
    ckpt = mouthguard.Checkpointer(store, run="job", background=False)
    torch.manual_seed(0)
    weights = torch.zeros(64)
    step = 0

    def current() -> tuple[int, object]:
        return step, {"w": weights.clone(), "step": step}

    with PreemptionGuard(ckpt, current, grace_seconds=grace) as guard:
        if mask_main:  # SIGTERM now goes to another thread; Python's handler never runs
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        for _ in range(10_000):  # bounded: the parent always signals long before
            step += 1
            weights += 1.0
            # Printed before the step's work so the next boundary is a whole step away.
            print(f"step {step}", flush=True)
            time.sleep(step_seconds)
            guard.at_step_boundary()
    sys.exit(3)  # never reached when the guard works


if __name__ == "__main__":
    main()
