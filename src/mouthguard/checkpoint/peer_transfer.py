"""Files between ranks over ``torch.distributed`` point-to-point, in bounded chunks.

Every rank of the group calls :meth:`PeerLink.exchange` with the same list of
transfers (who sends which file of how many bytes to whom); each takes part
in the ones naming it. The transfers run in rounds: in round ``c`` every
transfer with a ``c``-th chunk posts its ``isend``/``irecv`` at once (so no
pair waits on another), then every rank waits for its own. A rank thus holds
at most one chunk per transfer it takes part in: with ``R`` copies, at most
``2 (R - 1)`` chunks during a save's replication.

The receiver hashes the bytes as they arrive (xxh3-128, the manifests'
checksum) and writes them to the path its caller gave; the caller compares
the digest with the sender's record before it keeps the file.

The link has its own gloo group (created once, a collective), so transfers
never interleave with the training loop's collectives or the commit's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mouthguard.errors import CorruptCheckpointError, RankLostError
from mouthguard.format.checksum import StreamHasher


@dataclass(frozen=True)
class Transfer:
    """Rank ``src`` sends its file ``name`` (``size`` bytes) to rank ``dst``."""

    src: int
    dst: int
    name: str
    size: int


class PeerLink:
    """A private gloo group of every rank, for peer-memory transfers.

    Args:
        timeout: seconds one transfer round waits before the peer is given up on.
    """

    def __init__(self, timeout: float) -> None:
        import torch.distributed as dist  # noqa: PLC0415 - only multi-rank jobs have peers

        self._dist = dist
        self.timeout = timeout
        self._group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout))
        self.rank = dist.get_rank(self._group)

    def exchange(
        self,
        transfers: Sequence[Transfer],
        source: Callable[[Transfer], Path],
        sink: Callable[[Transfer], Path],
        chunk_bytes: int,
    ) -> dict[Transfer, str]:
        """Run ``transfers`` (the same list on every rank); digests of what this rank received.

        ``source(t)`` is the file this rank sends for ``t``, ``sink(t)`` where it
        writes what it receives (created or truncated).

        Raises:
            RankLostError: a peer died or did not answer within the timeout.
        """
        import torch  # noqa: PLC0415 - see __init__

        me = self.rank
        sending = [(tag, t) for tag, t in enumerate(transfers) if t.src == me]
        receiving = [(tag, t) for tag, t in enumerate(transfers) if t.dst == me]
        rounds = max((-(-t.size // chunk_bytes) for t in transfers), default=0)
        hashers = {t: StreamHasher() for _tag, t in receiving}
        with self._lost_peers(), contextlib.ExitStack() as stack:
            reads: dict[Transfer, BinaryIO] = {
                t: stack.enter_context(source(t).open("rb")) for _tag, t in sending
            }
            writes: dict[Transfer, BinaryIO] = {
                t: stack.enter_context(sink(t).open("wb")) for _tag, t in receiving
            }
            for index in range(rounds):
                start = index * chunk_bytes
                works: list[Any] = []
                inbound: list[tuple[Transfer, Any]] = []
                for tag, t in sending:
                    if start < t.size:
                        chunk = torch.empty(min(chunk_bytes, t.size - start), dtype=torch.uint8)
                        _read_exactly(reads[t], memoryview(chunk.numpy()))  # type: ignore[arg-type]
                        works.append(self._send(chunk, t.dst, tag))
                for tag, t in receiving:
                    if start < t.size:
                        chunk = torch.empty(min(chunk_bytes, t.size - start), dtype=torch.uint8)
                        works.append(self._recv(chunk, t.src, tag))
                        inbound.append((t, chunk))
                for work in works:
                    work.wait()
                for t, chunk in inbound:
                    view = memoryview(chunk.numpy())
                    hashers[t].update(view)
                    writes[t].write(view)
        return {t: hasher.xxh3 for t, hasher in hashers.items()}

    @contextlib.contextmanager
    def _lost_peers(self) -> Iterator[None]:
        """Turn gloo's failure (a closed connection, a timeout) into RankLostError."""
        try:
            yield
        except RuntimeError as exc:
            raise RankLostError(
                f"peer memory: a transfer between ranks failed -- a peer died or did not "
                f"answer within {self.timeout:g} s ({exc})"
            ) from exc

    def _send(self, chunk: Any, dst: int, tag: int) -> Any:
        peer = self._dist.get_global_rank(self._group, dst)
        return self._dist.isend(chunk, peer, group=self._group, tag=tag)

    def _recv(self, chunk: Any, src: int, tag: int) -> Any:
        peer = self._dist.get_global_rank(self._group, src)
        return self._dist.irecv(chunk, peer, group=self._group, tag=tag)


def _read_exactly(source: BinaryIO, into: memoryview) -> None:
    """Fill ``into`` from ``source`` (straight into the send buffer: no extra copy).

    Raises:
        CorruptCheckpointError: the file is shorter than its record says.
    """
    filled = 0
    while filled < into.nbytes:
        got = source.readinto(into[filled:])  # type: ignore[attr-defined]
        if not got:
            raise CorruptCheckpointError(
                f"peer memory: {source.name} ended after {filled} of {into.nbytes} bytes"
            )
        filled += got
