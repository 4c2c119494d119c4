"""The state a chaos run saves at each step, and the exact comparison that judges a load."""

from __future__ import annotations


def chaos_state(step: int) -> dict[str, object]:
    """The state saved at ``step``: deterministic, a few KiB, of varying size and dtypes."""
    # torch is imported here, not at the top: `mouthguard --help` imports this module.
    import torch  # noqa: PLC0415

    gen = torch.Generator().manual_seed(step)
    n = 64 + (step * 37) % 1500
    return {
        "model": {
            "w": torch.randn(n, generator=gen),
            "b": torch.arange(step % 17, dtype=torch.int64),
            "h": torch.randn(3, step % 5 + 1, generator=gen).to(torch.float16),
        },
        "step": step,
        "tag": f"step-{step}",
    }


def same_state(got: object, want: object) -> bool:
    """Exact equality: same structure, same plain values, tensors with identical bytes."""
    import torch  # noqa: PLC0415 - see chaos_state

    if isinstance(want, torch.Tensor):
        return (
            isinstance(got, torch.Tensor)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and torch.equal(got, want)
        )
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same_state(got[k], want[k]) for k in want)
        )
    if isinstance(want, list | tuple):
        return (
            type(got) is type(want)
            and len(got) == len(want)
            and all(same_state(a, b) for a, b in zip(got, want, strict=True))
        )
    return type(got) is type(want) and got == want
