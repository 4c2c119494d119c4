"""Child process for the crash test: saves forever until killed.

Prints ``saving N`` before and ``acked N`` after each save (flushing), so the
parent knows which saves were acknowledged and when one is in flight.
"""

from __future__ import annotations

import sys

import torch

import mouthguard

ELEMENTS = 4 * 1024 * 1024  # 16 MiB of float32 per save: long enough to be hit mid-write


def state_for(step: int) -> dict[str, object]:
    """The deterministic state saved at ``step`` (the parent recomputes it to compare)."""
    return {
        "w": torch.arange(ELEMENTS, dtype=torch.float32) + step,
        "b": torch.full((1000,), float(step), dtype=torch.bfloat16),
        "meta": {"step": step, "note": f"save {step}"},
    }


def main() -> None:
    """Save steps ``start, start+1, ...`` (bounded) into the store given on argv."""
    store, start = sys.argv[1], int(sys.argv[2])
    ckpt = mouthguard.Checkpointer(store, run="crash")
    for step in range(start, start + 1000):
        state = state_for(step)
        print(f"saving {step}", flush=True)
        ckpt.save(step, state)
        print(f"acked {step}", flush=True)


if __name__ == "__main__":
    main()
