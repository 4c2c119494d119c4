"""The parts of a streamed S3 upload: private copies of ``part_size`` bytes each.

obstore keeps references to the buffers it was given until their part is sent,
while a streaming caller may refill one buffer for every chunk it yields. Each
chunk is therefore copied, once, into a private part buffer; the caller's own
exception is kept so that ``S3Tier.put`` can re-raise it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mouthguard.tiers.base import BytesLike, PutData, iter_buffers


class PartStream:
    """Regroups a caller's stream of buffers into private copies of ``part_size`` bytes.

    Attributes:
        size: bytes taken from the caller's stream so far.
        error: what the caller's stream raised, if it did (``put`` re-raises it).
    """

    def __init__(self, data: Iterable[BytesLike], part_size: int) -> None:
        self._chunks = iter_buffers(data)
        self._part_size = part_size
        # The rest of a chunk that straddles a part boundary. The caller's generator
        # stays suspended until it is used up, so its buffer cannot change meanwhile.
        self._pending: memoryview | None = None
        self.size = 0
        self.error: BaseException | None = None

    def _next_part(self) -> bytearray | None:
        part = bytearray()
        while len(part) < self._part_size:
            view, self._pending = self._pending, None
            if view is None:
                try:
                    view = next(self._chunks)
                except StopIteration:
                    break
                except BaseException as exc:
                    self.error = exc
                    raise
            take = min(view.nbytes, self._part_size - len(part))
            part += view[:take]
            if take < view.nbytes:
                self._pending = view[take:]
        self.size += len(part)
        return part if part else None

    def first_parts(self) -> list[bytearray]:
        """The first part, plus the second if there is one (then the upload is multipart)."""
        first = self._next_part() or bytearray()
        second = self._next_part() if len(first) == self._part_size else None
        return [first] if second is None else [first, second]

    def all_parts(self, first: list[bytearray]) -> Iterator[bytearray]:
        """Yield ``first``, then the remaining parts of the stream."""
        yield from first
        while (part := self._next_part()) is not None:
            yield part


def put_payload(
    data: PutData, part_size: int, *, single: bool
) -> tuple[BytesLike | Iterator[bytearray], int, PartStream | None, bool]:
    """What a put hands obstore: ``(payload, size, stream, multipart)``.

    A buffer goes as it is (``size`` known, ``stream`` None); an iterable is cut
    into parts whose first ones are read now, so that the caller's own errors
    surface before any I/O (``size`` is 0: the stream's is known once it is
    sent). A single create-only PUT (``single``) is never multipart.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        size = memoryview(data).nbytes
        return memoryview(data).cast("B"), size, None, size > part_size and not single
    stream = PartStream(data, part_size)
    parts = stream.first_parts()
    payload = parts[0] if len(parts) == 1 else stream.all_parts(parts)
    return payload, 0, stream, len(parts) > 1 and not single
