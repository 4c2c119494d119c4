"""The scheduler's lookups of the workers' stores, over the local socket, with real KVStores."""

from __future__ import annotations

import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mouthguard.errors import KVCacheError
from mouthguard.integrations.vllm.channel import (
    LookupClient,
    LookupServer,
    socket_dir,
    socket_path,
)
from mouthguard.kvcache import KVNamespace, KVStore

BLOCK = 16


def _blocks(n: int) -> list[np.ndarray]:
    return [np.full((2, BLOCK, 4), i, dtype=np.float32) for i in range(n)]


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[tuple[list[KVStore], LookupClient]]:
    engine = f"test-{uuid.uuid4()}"
    stores = [
        KVStore(
            memory_bytes=1 << 20,
            block_tokens=BLOCK,
            namespace=KVNamespace("m", tp_rank=r, tp_size=2),
        )
        for r in range(2)
    ]
    servers = [LookupServer(s, socket_path(engine, r)) for r, s in enumerate(stores)]
    client = LookupClient([socket_path(engine, r) for r in range(2)], timeout_s=5)
    yield stores, client
    client.close()
    for server, store in zip(servers, stores, strict=True):
        server.close()
        store.close()
        assert not Path(server.path).exists()


def test_a_block_counts_only_when_every_rank_holds_it(
    ranks: tuple[list[KVStore], LookupClient],
) -> None:
    (first, second), client = ranks
    tokens = list(range(1, 4 * BLOCK + 5))
    first.put(tokens[: 3 * BLOCK], _blocks(3))
    second.put(tokens[: 2 * BLOCK], _blocks(2))
    assert client.longest_prefix(tokens) == 2 * BLOCK
    assert client.longest_prefix([9999] * BLOCK) == 0


def test_pins_are_counted_and_released_per_rank(
    ranks: tuple[list[KVStore], LookupClient],
) -> None:
    (first, second), client = ranks
    tokens = list(range(1, 3 * BLOCK + 1))
    first.put(tokens, _blocks(3))
    second.put(tokens[: 2 * BLOCK], _blocks(2))
    pinned = client.pin(tokens)
    assert pinned == [3 * BLOCK, 2 * BLOCK]
    client.unpin(tokens, pinned)
    for store in (first, second):
        assert not store._placement.pins  # every pin released, none driven below zero


def test_a_worker_error_reaches_the_scheduler_as_a_kv_error(
    ranks: tuple[list[KVStore], LookupClient],
) -> None:
    _, client = ranks
    with pytest.raises(KVCacheError, match=r"negative|token"):
        client.longest_prefix([-1] * BLOCK)


def test_no_worker_is_an_error_after_the_timeout() -> None:
    client = LookupClient([socket_path(f"absent-{uuid.uuid4()}", 0)], timeout_s=0.2)
    with pytest.raises(KVCacheError, match="no mouthguard worker answered"):
        client.longest_prefix([1, 2, 3])


def test_the_socket_directory_is_private() -> None:
    mode = Path(socket_dir()).stat().st_mode
    assert stat.S_IMODE(mode) == 0o700
