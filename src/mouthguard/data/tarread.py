"""The loader's reader of tar shards: samples out of verified shard files, by index.

A shard is opened whole and verified against the manifest's sha256 before any
of its samples is read (:class:`~mouthguard.data.fetch.ShardSource`); its index
is checked and parsed as hostile input. A sample is then one read of its span,
cut into members as the index says.

Packed shards are also checked member by member: each member's USTAR header must
be where the index puts it and name the member, with its size
(:func:`~mouthguard.data.tarfmt.member_mismatch`), so an index that points
anywhere else is caught as the sample is read. The header's own checksum is not
recomputed there: the whole shard already matched the manifest's sha256. An
adopted shard's headers are whatever the user's writer chose (GNU long names,
PAX records) and have no one-block form to compare with; its index was derived
from those very bytes by ``tarfile`` (:mod:`~mouthguard.data.tarscan`), the
bytes are verified whole first, and ``verify`` derives the index again and
compares -- so the reader takes the verified index as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mouthguard.data import names, tarfmt
from mouthguard.data.cache import ShardFile
from mouthguard.data.fetch import ShardSource
from mouthguard.errors import ShardDamagedError

Sample = dict[str, Any]


class TarUnits:
    """Shards as the loader's units: open one (verified), read samples of the open ones."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source
        self.adopted = source.dataset.manifest.adopted

    def open_unit(self, number: int, *, must: bool) -> ShardFile | None:
        """Shard ``number``, verified and open (None: no room for a prefetch)."""
        return self.source.open_shard(number, must=must)

    def read(
        self, opened: Mapping[int, ShardFile], units: Sequence[int], items: Sequence[int]
    ) -> Iterator[Sample]:
        """Sample ``items[i]`` of shard ``units[i]``, for each ``i`` in turn, one at a time."""
        for unit, number in zip(units, items, strict=True):
            yield self._sample(opened[unit], unit, number)

    def _sample(self, file: ShardFile, unit: int, number: int) -> Sample:
        entry = self.source.index(unit).samples[number]
        span = memoryview(file.read(entry.offset, entry.length))
        sample: Sample = {"__key__": entry.key}
        for member in entry.members:
            at = member.offset - entry.offset
            if not self.adopted:
                header = span[at - tarfmt.BLOCK : at]
                name = names.member_name(entry.key, member.ext).encode()
                problem = tarfmt.member_mismatch(header, name, member.size)
                if problem is not None:
                    raise ShardDamagedError(f"shard {file.name}: {problem}", shard=file.name)
            sample[member.ext] = bytes(span[at : at + member.size])
        return sample
