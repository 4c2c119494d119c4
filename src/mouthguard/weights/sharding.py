"""Tensor-parallel slicing: which bytes of a stored tensor belong to this rank.

A tensor-parallel inference instance of ``size`` GPUs holds, on rank ``r``, the
``r``-th of ``size`` equal parts of each sharded weight along one dimension
(column-parallel layers split the output dimension, row-parallel ones the input
dimension), and whole copies of the rest. Loading only those bytes is what
makes a cold start scale with the instance: each GPU reads ``1/size`` of the
sharded weights.

:class:`TensorParallel` maps tensor names to the dimension they are split on,
by ``fnmatch`` patterns tried in order (the first match wins; no match: the
tensor is loaded whole). :func:`slice_ranges` turns one split into byte ranges of
the stored tensor. Pure arithmetic: no I/O, no torch.

Invariants: a split must divide the dimension exactly (an uneven split is an
error naming the tensor, never silently padded or truncated); the ranges are
sorted, disjoint, inside the tensor, and together hold exactly the slice's
bytes in its row-major order.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mouthguard.errors import WeightsError


@dataclass(frozen=True)
class Split:
    """This rank's part of one tensor: ``[start, stop)`` along ``dim``."""

    dim: int
    start: int
    stop: int

    def shape(self, full: Sequence[int]) -> tuple[int, ...]:
        """The shape of the part of a tensor of shape ``full``."""
        shape = list(full)
        shape[self.dim] = self.stop - self.start
        return tuple(shape)


@dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of ``size``; ``rules`` map name patterns to the split dimension.

    Example: ``TensorParallel(0, 2, (("*.q_proj.weight", 0), ("*.o_proj.weight", 1)))``.
    A negative dimension counts from the end, as in torch.
    """

    rank: int
    size: int
    rules: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise WeightsError(f"tensor-parallel rank {self.rank} of {self.size} is impossible")

    def split_for(self, name: str, shape: Sequence[int]) -> Split | None:
        """This rank's split of tensor ``name`` (None: loaded whole).

        Raises:
            WeightsError: the rule's dimension does not exist in the tensor, or the
                size does not divide it.
        """
        if self.size == 1:
            return None
        dim = next((d for pattern, d in self.rules if fnmatch.fnmatchcase(name, pattern)), None)
        if dim is None:
            return None
        if not -len(shape) <= dim < len(shape):
            raise WeightsError(f"{name}: shape {list(shape)} has no dimension {dim} to split")
        dim %= len(shape)
        if shape[dim] % self.size:
            raise WeightsError(
                f"{name}: dimension {dim} of {list(shape)} does not split into {self.size} "
                "equal parts"
            )
        part = shape[dim] // self.size
        return Split(dim, self.rank * part, (self.rank + 1) * part)


def parse_rules(texts: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``["*.q_proj.weight=0", ...]`` as rules (the CLI's ``--tp-rule``).

    Raises:
        WeightsError: a rule is not ``PATTERN=DIM`` with an integer DIM.
    """
    rules = []
    for text in texts:
        pattern, sep, dim = text.rpartition("=")
        try:
            rules.append((pattern, int(dim)))
        except ValueError:
            sep = ""
        if not sep or not pattern:
            raise WeightsError(f"tensor-parallel rule {text!r} is not PATTERN=DIM")
    return tuple(rules)


def slice_ranges(shape: Sequence[int], itemsize: int, split: Split) -> list[tuple[int, int]]:
    """Byte ranges ``(offset, length)`` of ``split`` within a row-major tensor of ``shape``.

    Splitting dimension 0 gives one range; dimension ``d`` gives one range per
    index of the dimensions before it (adjacent ranges are merged).
    """
    inner = math.prod(shape[split.dim + 1 :]) * itemsize
    stride = shape[split.dim] * inner  # bytes of one index of the outer dimensions
    outer = math.prod(shape[: split.dim])
    length = (split.stop - split.start) * inner
    ranges: list[tuple[int, int]] = []
    for index in range(outer):
        offset = index * stride + split.start * inner
        if ranges and ranges[-1][0] + ranges[-1][1] == offset:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
        elif length:
            ranges.append((offset, length))
    return ranges
