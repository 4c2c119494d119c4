"""The conformance suite's first part: what a tier does with the bytes of an object.

Round trips of buffers, chunk streams and typed views; ``put`` copying its input
and being all-or-nothing; ranges of ``get`` and ``read_into``, and their
refusals; missing objects. :class:`~mouthguard.testing.conformance.TierConformance`
inherits :class:`BytesContract`; subclass that one, not this.
"""

from __future__ import annotations

import array
import random
from collections.abc import Iterator

import pytest

from mouthguard.errors import InvalidKeyError, ObjectNotFoundError, TierError
from mouthguard.tiers.base import BytesLike, Tier

__all__ = ["BytesContract", "MiB", "payload"]

MiB = 1024 * 1024


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` reproducible pseudo-random bytes (the same ``seed`` gives the same bytes)."""
    return random.Random(seed).randbytes(size)  # noqa: S311 - test data, not secrets


def _assert_plain_tier_error(excinfo: pytest.ExceptionInfo[TierError]) -> None:
    # Range errors must be reported as such, not disguised as a missing object.
    assert not isinstance(excinfo.value, ObjectNotFoundError | InvalidKeyError)


class BytesContract:
    """The byte-level contract of a tier, as tests (the ``tier`` fixture is the subclass's)."""

    # --- put / get -------------------------------------------------------------

    @pytest.mark.parametrize("size", [0, 1, 4096, 100_003])
    def test_roundtrip_single_buffer(self, tier: Tier, size: int) -> None:
        """One buffer in, the same bytes out; ``put`` reports the size."""
        data = payload(size, seed=size)
        info = tier.put("obj/one", data)
        assert (info.key, info.size) == ("obj/one", size)
        assert tier.get("obj/one") == data

    def test_roundtrip_mixed_chunks(self, tier: Tier) -> None:
        """An iterable of bytes, bytearray, memoryview and empty chunks is written in order."""
        chunks: list[BytesLike] = [
            b"abc",
            bytearray(b"defg"),
            memoryview(b"hij"),
            b"",
            memoryview(bytearray(b"k")),
        ]
        info = tier.put("chunks", chunks)
        assert info.size == 11
        assert tier.get("chunks") == b"abcdefghijk"

    def test_roundtrip_generator_and_typed_views(self, tier: Tier) -> None:
        """Chunks from a generator, typed memoryviews included, count in bytes."""
        ints = array.array("i", range(100))

        def gen() -> Iterator[memoryview]:
            yield memoryview(ints)
            yield memoryview(b"tail")

        tier.put("typed", gen())
        assert tier.get("typed") == ints.tobytes() + b"tail"
        assert tier.head("typed").size == len(ints.tobytes()) + 4

    def test_five_mib_object_streamed(self, tier: Tier) -> None:
        """A multi-MiB stream round-trips; ``read_into`` writes nothing past its view."""
        data = payload(5 * MiB, seed=5)
        chunks = (data[i : i + MiB] for i in range(0, len(data), MiB))
        assert tier.put("big/blob", chunks).size == 5 * MiB
        assert tier.get("big/blob") == data
        out = bytearray(MiB)
        tier.read_into("big/blob", 3 * MiB + 7, memoryview(out)[: MiB - 7])
        assert out[: MiB - 7] == data[3 * MiB + 7 : 4 * MiB]
        assert out[MiB - 7 :] == bytes(7)  # nothing written past the view

    def test_put_copies_its_input(self, tier: Tier) -> None:
        """The tier keeps its own copy: changing the caller's buffer later changes nothing."""
        buf = bytearray(b"original")
        tier.put("copy", buf)
        buf[:] = b"mutated!"
        assert tier.get("copy") == b"original"

    def test_put_copies_each_reused_chunk(self, tier: Tier) -> None:
        """A stream may refill one buffer for every chunk: each is consumed before the next."""
        # A streaming writer may refill one buffer for every chunk.
        buf = bytearray(4)

        def refill() -> Iterator[bytearray]:
            for word in (b"aaaa", b"bbbb", b"cccc"):
                buf[:] = word
                yield buf

        tier.put("reused", refill())
        assert tier.get("reused") == b"aaaabbbbcccc"

    def test_failing_iterable_is_all_or_nothing(self, tier: Tier) -> None:
        """A stream that raises publishes nothing; the exception reaches the caller unchanged."""
        tier.put("keep", b"old")

        def broken() -> Iterator[bytes]:
            yield b"x" * 1000
            raise RuntimeError("source died")

        with pytest.raises(RuntimeError, match="source died"):
            tier.put("keep", broken())
        with pytest.raises(RuntimeError, match="source died"):
            tier.put("fresh/obj", broken())
        assert tier.get("keep") == b"old"
        assert not tier.exists("fresh/obj")
        assert list(tier.list()) == ["keep"]

    # --- ranges ----------------------------------------------------------------

    def test_get_ranges(self, tier: Tier) -> None:
        """``get(key, start, end)`` returns exactly that slice; empty ranges at the end are fine."""
        data = payload(1000, seed=1)
        tier.put("r", data)
        assert tier.get("r", 10, 20) == data[10:20]
        assert tier.get("r", 990) == data[990:]
        assert tier.get("r", 0, 0) == b""
        assert tier.get("r", 1000) == b""
        assert tier.get("r", 1000, 1000) == b""

    @pytest.mark.parametrize(("start", "end"), [(-1, None), (5, 2), (0, 1001), (1001, None)])
    def test_get_bad_ranges_raise(self, tier: Tier, start: int, end: int | None) -> None:
        """Negative, reversed or past-the-end ranges raise a plain TierError, never a short read."""
        tier.put("r", payload(1000))
        with pytest.raises(TierError) as excinfo:
            tier.get("r", start, end)
        _assert_plain_tier_error(excinfo)

    def test_read_into_at_offsets(self, tier: Tier) -> None:
        """``read_into`` fills the whole view from the offset, for any item size."""
        data = payload(4096, seed=2)
        tier.put("ri", data)
        out = bytearray(100)
        tier.read_into("ri", 123, memoryview(out))
        assert bytes(out) == data[123:223]
        tier.read_into("ri", 4096 - 100, memoryview(out))
        assert bytes(out) == data[-100:]
        tier.read_into("ri", 4096, memoryview(out)[:0])  # empty read at the very end
        words = array.array("H", [0] * 8)
        tier.read_into("ri", 2, memoryview(words))
        assert words.tobytes() == data[2:18]

    @pytest.mark.parametrize(("offset", "size"), [(4000, 100), (-1, 4), (4097, 0)])
    def test_read_into_past_end_raises(self, tier: Tier, offset: int, size: int) -> None:
        """``read_into`` past the end raises a plain TierError."""
        tier.put("ri", payload(4096))
        out = bytearray(size)
        with pytest.raises(TierError) as excinfo:
            tier.read_into("ri", offset, memoryview(out))
        _assert_plain_tier_error(excinfo)

    def test_every_range_of_a_small_object(self, tier: Tier) -> None:
        """Every valid range of a small object reads its slice; every invalid one raises."""
        # Exhaustive over a small domain: every valid range reads exactly the
        # slice, every invalid one (negative, reversed, past the end) raises.
        data = payload(13, seed=4)
        tier.put("small", data)
        for start in range(-1, 16):
            for end in [None, *range(-1, 16)]:
                stop = len(data) if end is None else end
                valid = 0 <= start <= stop <= len(data)
                if valid:
                    assert tier.get("small", start, end) == data[start:stop]
                    out = bytearray(stop - start)
                    tier.read_into("small", start, memoryview(out))
                    assert bytes(out) == data[start:stop]
                else:
                    with pytest.raises(TierError):
                        tier.get("small", start, end)
                if not valid and start >= 0 and stop >= start:
                    with pytest.raises(TierError):
                        tier.read_into("small", start, memoryview(bytearray(stop - start)))

    def test_missing_objects(self, tier: Tier) -> None:
        """Reading or heading a missing key raises ObjectNotFoundError; ``exists`` is False."""
        with pytest.raises(ObjectNotFoundError):
            tier.get("nope")
        with pytest.raises(ObjectNotFoundError):
            tier.read_into("nope", 0, memoryview(bytearray(1)))
        with pytest.raises(ObjectNotFoundError):
            tier.head("nope/deeper")
        assert not tier.exists("nope")
