"""Built-in semantic checks for ``Checkpointer.load(check=...)`` and ``save(check=...)``.

Integrity checksums prove the bytes are the ones saved; they cannot prove the
state is worth resuming from. A run that saved after its loss went to NaN has a
perfectly intact checkpoint of a dead model. These checks look at the state::

    from mouthguard import checks
    loaded = ckpt.load(check=checks.finite())                  # no NaN/Inf in float tensors
    loaded = ckpt.load(check=checks.reference(loss=eval_loss, rtol=0.05))
    ckpt.save(step, state, check=checks.finite())   # NaN never committed as a recovery point

Every check returns ``None`` when the state passes, else a one-line reason
(see :mod:`mouthguard.checkpoint.checking` for the contract and how verdicts are
kept). ``all_of`` combines them. A check of your own is any :data:`Check`: a
callable taking a :class:`CheckInput`, both importable from here.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mouthguard.checkpoint.checking import Check, CheckInput

if TYPE_CHECKING:
    import torch

__all__ = ["Check", "CheckInput", "Recomputed", "all_of", "finite", "reference"]

#: How many offending key paths a reason names.
_NAMED = 3


def _tensors(value: object, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    # A state holding tensors has imported torch; importing this module must not
    # (the CLI imports the package and starts in a fraction of a second).
    torch_module = sys.modules.get("torch")
    if torch_module is not None and isinstance(value, torch_module.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{path}[{i}]")


def finite() -> Check:
    """A check that fails when any floating-point (or complex) tensor holds NaN or Inf.

    Integer and boolean tensors and plain Python values are not looked at (an
    ``inf`` "best loss so far" is a legitimate starting value). The reason names
    the first few offending key paths with their NaN and Inf counts.
    """

    def check(subject: CheckInput) -> str | None:
        import torch  # noqa: PLC0415 - see _tensors

        bad = []
        for path, tensor in _tensors(subject.state, "state"):
            if not (tensor.is_floating_point() or tensor.is_complex()):
                continue
            if bool(torch.isfinite(tensor).all()):
                continue
            nan = int(torch.isnan(tensor).sum())
            bad.append(f"{path}: {nan} NaN, {tensor.numel() - nan - _finite(tensor)} Inf")
        if not bad:
            return None
        more = f" and {len(bad) - _NAMED} more tensors" if len(bad) > _NAMED else ""
        return "non-finite values in " + "; ".join(bad[:_NAMED]) + more

    return check


def _finite(tensor: torch.Tensor) -> int:
    return int(tensor.isfinite().sum())


Recomputed = float | Callable[[object], float]


def reference(*, rtol: float = 1e-3, atol: float = 0.0, **expected: Recomputed) -> Check:
    """A check that compares the reference values saved with the checkpoint to recomputed ones.

    Args:
        rtol: relative tolerance (``math.isclose``'s ``rel_tol``).
        atol: absolute tolerance.
        expected: name -> the value the caller recomputed after loading (e.g. the
            loss on a fixed batch), or a callable that computes it from the loaded
            state. Each name must have been saved (``save(reference={name: ...})``).

    The check fails when a name was not saved, a value is not a finite number,
    or the two differ beyond the tolerances; the reason gives both values.

    Raises:
        ValueError: no name given, or a negative or non-finite tolerance.
    """
    if not expected:
        raise ValueError("reference() needs at least one value to compare, e.g. loss=...")
    if not (math.isfinite(rtol) and math.isfinite(atol) and rtol >= 0 and atol >= 0):
        raise ValueError(f"tolerances must be finite and >= 0, got rtol={rtol}, atol={atol}")

    def check(subject: CheckInput) -> str | None:
        problems = []
        for name, want in expected.items():
            saved = subject.reference.get(name)
            if not _number(saved):
                problems.append(f"{name}: no numeric reference saved (got {saved!r})")
                continue
            stored = float(saved)  # type: ignore[arg-type]  # _number checked it
            now = float(want(subject.state) if callable(want) else want)
            if not (math.isfinite(stored) and math.isfinite(now)):
                problems.append(f"{name}: saved {stored}, recomputed {now} (not finite)")
            elif not math.isclose(now, stored, rel_tol=rtol, abs_tol=atol):
                problems.append(
                    f"{name}: saved {stored:.6g}, recomputed {now:.6g} "
                    f"(beyond rtol={rtol:g}, atol={atol:g})"
                )
        return "reference mismatch: " + "; ".join(problems) if problems else None

    return check


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def all_of(*checks: Check) -> Check:
    """A check that runs ``checks`` in order and fails with the first failure."""

    def check(subject: CheckInput) -> str | None:
        for one in checks:
            verdict = one(subject)
            if verdict:
                return verdict
        return None

    return check
