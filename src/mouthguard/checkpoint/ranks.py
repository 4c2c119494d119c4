"""The ranks that save one checkpoint together: a single process, or a torch.distributed job.

:class:`RankGroup` is the few collective operations the commit protocol needs.
Values travel as JSON bytes in uint8 tensors (``all_gather``), never pickled, so
a peer can never make another rank execute code.

:class:`TorchRanks` runs on its own gloo process group, created once at
construction (a collective call: every rank must construct its
:class:`~mouthguard.checkpoint.checkpointer.Checkpointer` in the same order).
Its own group matters for async saves: their collectives run in a background
thread and must never interleave with the training loop's collectives on the
default (possibly NCCL) group.

A rank that dies (SIGKILL, OOM killer, a node lost) in the middle of a save
must not hang the others: every collective of the group waits at most its
timeout (:data:`COLLECTIVE_TIMEOUT` by default, ``Checkpointer(...,
collective_timeout=...)``), and a collective that fails -- a peer's connection
closed, or nothing heard within the timeout -- raises :class:`RankLostError` on
the surviving ranks. The save in flight is then committed only if its manifest
made it to the fast tier; a restart of all ranks resumes from the newest
committed checkpoint, and the survivors' staged files are debris for ``gc``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

from typing_extensions import override

from mouthguard.errors import RankLostError
from mouthguard.format.typed_json import JsonValue

#: How long one checkpoint collective may wait for the slowest rank: the slowest
#: rank's write of its file must fit in it, and a dead rank is given up on after it.
COLLECTIVE_TIMEOUT = dt.timedelta(minutes=5)
#: Bytes of a value that travel in the first (always the only when they fit)
#: collective of :meth:`TorchRanks.all_gather`: each gather moves this times the
#: world size at least, and a value longer than this costs a second collective.
INLINE_BYTES = 4096
_LENGTH_BYTES = 8


class RankGroup:
    """A single process: rank 0 of 1. Every collective is the identity."""

    rank = 0
    world_size = 1

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 writes the manifest and decides for everyone."""
        return self.rank == 0

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """Every rank's ``value``, indexed by rank (the same list on every rank)."""
        return [value]

    def broadcast(self, value: JsonValue) -> JsonValue:
        """The coordinator's ``value`` on every rank (others pass anything)."""
        return value

    def describe(self) -> str:
        """A short label for logs."""
        return "single process"


class TorchRanks(RankGroup):
    """The ranks of an initialised ``torch.distributed`` job, on a private gloo group."""

    def __init__(self, group: Any = None, timeout: dt.timedelta = COLLECTIVE_TIMEOUT) -> None:
        import torch.distributed as dist  # noqa: PLC0415 - only for multi-rank jobs

        self._dist = dist
        self.timeout = timeout
        ranks = None if group is None else dist.get_process_group_ranks(group)
        self._group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)
        self.rank = dist.get_rank(self._group)
        self.world_size = dist.get_world_size(self._group)

    @override
    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """Every rank's ``value`` as JSON bytes over gloo (see the module docstring).

        Raises:
            RankLostError: a peer died or did not answer within the timeout.
        """
        try:
            return self._all_gather(value)
        except RuntimeError as exc:  # gloo: a closed connection or a timeout
            raise RankLostError(
                f"{self.describe()}: a checkpoint collective failed -- a peer rank died or "
                f"did not answer within {self.timeout.total_seconds():g} s ({exc}). The save "
                "in flight is committed only if its manifest reached the fast tier; restart "
                "every rank to resume from the newest committed checkpoint"
            ) from exc

    def _all_gather(self, value: JsonValue) -> list[JsonValue]:
        import torch  # noqa: PLC0415 - single-process users of this module never need torch

        payload = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        # One collective for what fits INLINE_BYTES (every gather of the commit and
        # the resume protocol but a manifest's): its length and its first bytes.
        # Each rank then knows every length; a longer payload costs a second round.
        head = torch.zeros(_LENGTH_BYTES + INLINE_BYTES, dtype=torch.uint8)
        head[:_LENGTH_BYTES] = torch.frombuffer(
            bytearray(len(payload).to_bytes(_LENGTH_BYTES, "little")), dtype=torch.uint8
        )
        inline = payload[:INLINE_BYTES]
        if inline:
            head[_LENGTH_BYTES : _LENGTH_BYTES + len(inline)] = torch.frombuffer(
                bytearray(inline), dtype=torch.uint8
            )
        heads = [torch.empty_like(head) for _ in range(self.world_size)]
        self._dist.all_gather(heads, head, group=self._group)
        raw = [bytes(h.numpy()) for h in heads]
        sizes = [int.from_bytes(r[:_LENGTH_BYTES], "little") for r in raw]
        longest = max(sizes)
        if longest <= INLINE_BYTES:
            payloads = [
                r[_LENGTH_BYTES : _LENGTH_BYTES + n] for r, n in zip(raw, sizes, strict=True)
            ]
        else:
            mine = torch.zeros(longest, dtype=torch.uint8)
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            received = [torch.empty_like(mine) for _ in range(self.world_size)]
            self._dist.all_gather(received, mine, group=self._group)
            payloads = [bytes(r[:n].numpy()) for r, n in zip(received, sizes, strict=True)]
        return [json.loads(p) for p in payloads]

    @override
    def broadcast(self, value: JsonValue) -> JsonValue:
        """The coordinator's value; built on ``all_gather`` (payloads here are small)."""
        return self.all_gather(value if self.is_coordinator else None)[0]

    @override
    def describe(self) -> str:
        """``rank r of n``."""
        return f"rank {self.rank} of {self.world_size}"


def detect_ranks(group: Any = None, timeout: dt.timedelta = COLLECTIVE_TIMEOUT) -> RankGroup:
    """:class:`TorchRanks` when torch.distributed is initialised with >1 rank, else single.

    A :class:`RankGroup` given as ``group`` is used as it is: ``RankGroup()`` is
    "this process alone", for frameworks whose rank 0 writes the whole
    checkpoint while the other ranks never call the checkpointer (Lightning's
    ``CheckpointIO``, the Hugging Face ``Trainer``'s callbacks).
    """
    if isinstance(group, RankGroup):
        return group
    if "torch" not in sys.modules:
        # Nothing can have initialised torch.distributed without importing torch, and a
        # command that only reads (the CLI's ls, hold) must not pay seconds to import it.
        return RankGroup()
    try:
        import torch.distributed as dist  # noqa: PLC0415 - optional at runtime
    except ImportError:  # pragma: no cover - torch builds without distributed
        return RankGroup()
    if not dist.is_available() or not dist.is_initialized():
        return RankGroup()
    if dist.get_world_size(group) <= 1:
        return RankGroup()
    return TorchRanks(group, timeout)
