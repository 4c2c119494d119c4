"""The host ring: bytes in order, slots reused only after their copy, memory fixed by the slots."""

from __future__ import annotations

import pytest
import torch

from mouthguard.io.host_ring import HostRing, device_bytes, stream_from_device

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _sources(device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=gen) for n in (1, 1000, 0, 4097, 33)]
    return [device_bytes(t.to(device)) for t in tensors]


@pytest.mark.parametrize("slots", [2, 3, 5])
def test_stream_from_device_yields_every_byte_in_order(slots: int) -> None:
    sources = _sources("cpu")
    ring = HostRing(torch.device("cpu"), slots=slots, slot_bytes=1000)
    chunks = []
    for view in stream_from_device(sources, ring):
        assert view.nbytes <= 1000
        chunks.append(bytes(view))  # consumed before the next is asked for, as put() does
    assert b"".join(chunks) == b"".join(bytes(s.numpy()) for s in sources)
    assert ring.nbytes == slots * 1000 and not ring.pinned


def test_a_yielded_chunk_stays_intact_until_the_next_is_asked_for() -> None:
    # The ring queues copies ahead, but never into the slot the consumer holds.
    sources = [device_bytes(torch.arange(10_000, dtype=torch.int32))]
    ring = HostRing(torch.device("cpu"), slots=2, slot_bytes=4096)
    seen = []
    stream = stream_from_device(sources, ring)
    for view in stream:
        before = bytes(view)
        seen.append(before)
        assert bytes(view) == before
    assert b"".join(seen) == bytes(sources[0].numpy())


def test_to_device_copies_the_asked_part_of_a_slot() -> None:
    ring = HostRing(torch.device("cpu"), slots=2, slot_bytes=16)
    slot = ring.acquire(0)
    slot.copy_(torch.arange(16, dtype=torch.uint8))
    dest = torch.zeros(5, dtype=torch.uint8)
    ring.to_device(0, dest, start=3, nbytes=5)
    assert dest.tolist() == [3, 4, 5, 6, 7]
    assert ring.acquire(2) is slot  # index 2 of 2 slots is slot 0 again


def test_a_ring_needs_two_slots() -> None:
    with pytest.raises(ValueError, match="at least 2 slots"):
        HostRing(torch.device("cpu"), slots=1)


@CUDA
def test_cuda_ring_is_pinned_and_round_trips() -> None:  # pragma: no cover - GPU only
    sources = _sources("cuda")
    ring = HostRing(torch.device("cuda"), slots=3, slot_bytes=512)
    assert ring.pinned
    out = b"".join(bytes(v) for v in stream_from_device(sources, ring))
    assert out == b"".join(bytes(s.cpu().numpy()) for s in sources)
    dest = torch.zeros(512, dtype=torch.uint8, device="cuda")
    slot = ring.acquire(0)
    slot.copy_(torch.arange(512, dtype=torch.int64).to(torch.uint8))
    ring.to_device(0, dest)
    ring.drain()
    assert torch.equal(dest.cpu(), slot)
