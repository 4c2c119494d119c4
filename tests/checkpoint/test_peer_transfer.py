"""PeerLink.exchange across two real gloo processes: bytes, digests, chunk edges, errors.

Files of sizes around the chunk size and the look-ahead (``IN_FLIGHT`` chunks)
go both ways at once; what arrives must equal what was sent, byte for byte,
and the digest must be the file's xxh3-128. A file shorter than its transfer
says is refused on the sender, and the exchange raises on every rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mouthguard.checkpoint.peer_transfer import IN_FLIGHT, PeerLink, Transfer
from mouthguard.errors import CorruptCheckpointError, RankLostError
from mouthguard.format.checksum import StreamHasher
from tests.distributed import run_distributed

pytestmark = pytest.mark.xdist_group("peer-memory")

CHUNK = 1000
#: Sizes on both sides of one chunk, of the look-ahead window and past it.
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, IN_FLIGHT * CHUNK, IN_FLIGHT * CHUNK + 7, 9 * CHUNK + 3]


def _content(rank: int, size: int) -> bytes:
    return bytes((i * 7 + rank * 31 + size) % 251 for i in range(size))


def _transfers() -> list[Transfer]:
    # Both directions at once, interleaved, so each rank sends and receives in every round.
    return [Transfer(src, 1 - src, f"f{src}-{size}", size) for size in SIZES for src in (0, 1)]


def _exchange(rank: int, world_size: int, root: str) -> list[tuple[str, str, bool]]:
    """Every transfer's (name, digest received, bytes equal to the sender's) on this rank."""
    base = Path(root)
    sending, receiving = base / f"out{rank}", base / f"in{rank}"
    sending.mkdir()
    receiving.mkdir()
    transfers = _transfers()
    for t in transfers:
        if t.src == rank:
            (sending / t.name).write_bytes(_content(rank, t.size))
    link = PeerLink(timeout=30.0)
    digests = link.exchange(
        transfers, lambda t: sending / t.name, lambda t: receiving / t.name, CHUNK
    )
    out = []
    for t, digest in sorted(digests.items(), key=lambda item: item[0].name):
        expected = _content(t.src, t.size)
        hasher = StreamHasher()
        hasher.update(expected)
        got = (receiving / t.name).read_bytes()
        out.append((t.name, digest == hasher.xxh3, got == expected))
    return out


def test_files_arrive_whole_with_their_digest(tmp_path: Path) -> None:
    results = run_distributed(_exchange, 2, str(tmp_path), timeout=60.0)
    for rank, received in enumerate(results):
        assert [name for name, _, _ in received] == sorted(
            t.name for t in _transfers() if t.dst == rank
        )
        assert all(digest_ok and bytes_ok for _, digest_ok, bytes_ok in received), received


def _short_source(rank: int, world_size: int, root: str) -> str:
    """Rank 0's file is shorter than the transfer says; what each rank raised."""
    base = Path(root)
    (base / f"r{rank}").mkdir()
    source = base / "r0" / "short"
    if rank == 0:
        source.write_bytes(b"x" * 10)
    link = PeerLink(timeout=10.0)
    transfer = Transfer(0, 1, "short", 5 * CHUNK)
    try:
        link.exchange([transfer], lambda t: source, lambda t: base / "r1" / "short.part", CHUNK)
    except (CorruptCheckpointError, RankLostError) as exc:
        return type(exc).__name__
    return "nothing"


def test_a_short_file_to_send_is_refused(tmp_path: Path) -> None:
    results = run_distributed(_short_source, 2, str(tmp_path), timeout=30.0)
    # The sender names the problem; the receiver sees its peer give up.
    assert results[0] == "CorruptCheckpointError"
    assert results[1] == "RankLostError"
