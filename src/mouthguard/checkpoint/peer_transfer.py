"""Files between ranks over ``torch.distributed`` point-to-point, in bounded chunks.

Every rank of the group calls :meth:`PeerLink.exchange` with the same list of
transfers (who sends which file of how many bytes to whom); each takes part
in the ones naming it. The transfers run in rounds: in round ``c`` every
transfer with a ``c``-th chunk has the ``isend``/``irecv`` of chunk
``c + IN_FLIGHT - 1`` posted (so no pair waits on another, and up to
``IN_FLIGHT`` chunks of each transfer are on the wire while the receiver
hashes chunk ``c``), then every rank waits for its own chunk ``c``. Every
rank posts and waits in the same order, so no rank waits on an operation its
peer has not posted.

The bytes need no buffers of the link's own: the sender sends straight from
its file's pages (a private read-only mapping; on /dev/shm that is the node's
memory holding the copy) and the receiver receives straight into the pages of
the file its caller named, created at its full size and mapped. A transfer
therefore holds, beyond the two files, only gloo's socket buffers; the chunk
size bounds how much of a file one operation covers, not memory.

The receiver hashes each chunk once it has arrived (xxh3-128, the manifests'
checksum); the caller compares the digest with the sender's record before it
keeps the file (the sink is a ``.part`` name until then).

The link has its own gloo group (created once, a collective), so transfers
never interleave with the training loop's collectives or the commit's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import mmap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mouthguard.errors import CorruptCheckpointError, RankLostError
from mouthguard.format.checksum import StreamHasher

#: Chunks of one transfer posted at once. More overlap the receiver's hashing with
#: the wire; each is a view of a file, not a buffer, so this does not add memory.
IN_FLIGHT = 4
#: gloo tags are 32-bit signed integers; each chunk of each transfer has its own.
_MAX_TAG = 2**31 - 1


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
        writes what it receives (created or truncated, then sized to ``t.size``).

        Raises:
            RankLostError: a peer died or did not answer within the timeout.
            CorruptCheckpointError: a file to send is shorter than its record says.
            ValueError: more chunks than gloo has tags (use larger chunks).
        """
        me = self.rank
        rounds = max((-(-t.size // chunk_bytes) for t in transfers), default=0)
        if len(transfers) * rounds > _MAX_TAG:
            raise ValueError(
                f"peer memory: {len(transfers)} transfers of up to {rounds} chunks exceed "
                f"gloo's tags; use a larger chunk_bytes than {chunk_bytes}"
            )
        hashers = {t: StreamHasher() for t in transfers if t.dst == me}
        with self._lost_peers(), _Mapped() as files:
            mine: list[tuple[int, Transfer, Any]] = []
            for tag, t in enumerate(transfers):
                if t.src == me:
                    mine.append((tag, t, files.open(source(t), t.size, write=False)))
                elif t.dst == me:
                    mine.append((tag, t, files.open(sink(t), t.size, write=True)))
            self._rounds(mine, len(transfers), rounds, chunk_bytes, hashers)
            # The tensors viewing the maps died with _rounds' frame: they can be unmapped.
            del mine
        return {t: hasher.xxh3 for t, hasher in hashers.items()}

    def _rounds(
        self,
        mine: list[tuple[int, Transfer, Any]],
        count: int,
        rounds: int,
        chunk_bytes: int,
        hashers: dict[Transfer, StreamHasher],
    ) -> None:
        """Post and finish every chunk of this rank's transfers (``count`` in the list)."""
        me = self.rank
        pending: dict[tuple[int, int], Any] = {}
        for index in range(rounds + IN_FLIGHT - 1):
            # Post chunk `index` of every transfer (the look-ahead), then finish
            # chunk `index - IN_FLIGHT + 1`: the same order on every rank.
            for tag, t, data in mine:
                start = index * chunk_bytes
                if index < rounds and start < t.size:
                    chunk = data[start : start + chunk_bytes]
                    if t.src == me:
                        work = self._send(chunk, t.dst, tag + count * index)
                    else:
                        work = self._recv(chunk, t.src, tag + count * index)
                    pending[tag, index] = work
            done = index - IN_FLIGHT + 1
            for tag, t, data in mine:
                finished = pending.pop((tag, done), None)
                if finished is None:
                    continue
                finished.wait()
                if t.dst == me:
                    start = done * chunk_bytes
                    hashers[t].update(data[start : start + chunk_bytes].numpy())

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


class _Mapped:
    """Files mapped as byte tensors for one exchange; unmapped on exit.

    A sent file is mapped private (pages read in place, never written back); a
    received one is created at its full size and mapped shared, so what arrives
    lands in the file itself.
    """

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []

    def __enter__(self) -> _Mapped:
        return self

    def __exit__(self, *exc: object) -> None:
        maps, self._maps = self._maps, []
        for mapped in maps:
            # A tensor still viewing the map (an exception's frame) keeps it alive
            # until collected; the pages are freed then.
            with contextlib.suppress(BufferError):
                mapped.close()

    def open(self, path: Path, size: int, *, write: bool) -> Any:
        """``path``'s first ``size`` bytes as a uint8 tensor (created at ``size`` if ``write``).

        Raises:
            CorruptCheckpointError: a file to send is shorter than ``size``.
        """
        import torch  # noqa: PLC0415 - only multi-rank jobs have peers

        with path.open("w+b" if write else "rb") as handle:
            if write:
                handle.truncate(size)
            elif path.stat().st_size < size:
                raise CorruptCheckpointError(
                    f"peer memory: {path} has {path.stat().st_size} bytes, its record {size}"
                )
            if size == 0:
                return torch.empty(0, dtype=torch.uint8)
            access = mmap.ACCESS_WRITE if write else mmap.ACCESS_COPY
            mapped = mmap.mmap(handle.fileno(), size, access=access)
        self._maps.append(mapped)
        return torch.frombuffer(mapped, dtype=torch.uint8)
