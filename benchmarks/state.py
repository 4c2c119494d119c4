"""The benchmark state: sizes, a deterministic transformer-like dict of tensors, /proc readers."""

from __future__ import annotations

import os
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
MIB = 1024**2
N_TENSORS = 50


def parse_size(text: str) -> int:
    """``256M`` -> bytes (binary units: K, M, G, T)."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def size_label(nbytes: int) -> str:
    for unit, div in (("G", GIB), ("M", MIB), ("K", 1024)):
        if nbytes % div == 0:
            return f"{nbytes // div}{unit}"
    return str(nbytes)


def build_state(nbytes: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """~50 fp32 tensors of mixed sizes (matrices, embeddings, biases), deterministic.

    Uniform random floats from a seeded generator: incompressible like real weights,
    and about twice as fast to fill as ``randn`` (a 2 GiB state is built twice a run).
    """
    total = nbytes // 4
    # A transformer-ish mix: per "layer" a big matrix, a medium one, a small one, a bias.
    weights = [(64.0, 16.0, 4.0, 0.01)[i % 4] * (1.0 + (i % 7) / 7) for i in range(N_TENSORS)]
    scale = total / sum(weights)
    counts = [max(1, int(w * scale)) for w in weights]
    counts[0] += total - sum(counts)  # the first ("embedding") absorbs the remainder
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for i, n in enumerate(counts):
        t = torch.empty(n, dtype=torch.float32).uniform_(-1.0, 1.0, generator=gen)
        if n % 1024 == 0 and n >= 1024 * 16:
            t = t.view(n // 1024, 1024)
        kind = ("weight", "proj", "norm", "bias")[i % 4]
        state[f"layers.{i // 4}.{kind}.{i}"] = t
    return state


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def check_equal(a: dict[str, torch.Tensor], b: object, what: str) -> None:
    """Raise unless ``b`` holds exactly ``a``'s tensors (a correctness spot-check, untimed)."""
    if not isinstance(b, dict):
        raise TypeError(f"{what}: got {type(b).__name__}, not a dict")
    for k, v in a.items():
        if not torch.equal(v, b[k]):
            raise AssertionError(f"{what}: {k} differs")


def proc_status_kib(*fields: str) -> dict[str, int]:
    """Fields of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``...); missing ones are 0."""
    found = dict.fromkeys(fields, 0)
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0])
    return found


def child_pythonpath() -> str:
    """PYTHONPATH for a child process: the repository first, then what the parent had."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
