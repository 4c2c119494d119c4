"""``ShardWriter``: samples in, a committed WebDataset-compatible dataset out.

Write path, per shard: every member's USTAR header, data and padding
(:mod:`~mouthguard.data.formats.tarfmt`) are streamed straight to the tier with
``put(mode=CREATE)`` while the sha256 is computed on the same bytes
(:mod:`~mouthguard.data.writing.upload`); small pieces are gathered into 1 MiB chunks,
large members go through uncopied. When a shard is full its index is written,
then the next shard begins. ``close()`` writes ``dataset.json`` last,
create-only: its presence is the commit.

Invariants:

* **Deterministic.** The same samples in the same order give byte-identical
  shards and indexes: members are written in sorted extension order with fixed
  tar metadata, and JSON values are encoded with sorted keys. Only the
  manifest's ``created`` time differs between two runs.
* **All or nothing.** A writer that fails, is aborted, or leaves a ``with``
  block by an exception removes what it wrote and commits nothing. A process
  killed mid-write leaves objects without ``dataset.json``: invisible to every
  reader, refused by a new writer (:class:`~mouthguard.errors.DatasetExistsError`)
  until :func:`discard_incomplete` removes them.
* **Read back as written.** Keys, extensions and member names are refused
  unless WebDataset would read them back identically (:mod:`~mouthguard.data.formats.names`);
  duplicate keys and empty samples are refused. Duplicate detection keeps every
  key of the dataset in memory (about 100 bytes a sample).

Not thread-safe: one thread writes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Mapping
from types import TracebackType

from mouthguard.data.formats import names, tarfmt
from mouthguard.data.formats.index import Member, SampleEntry, encode_index
from mouthguard.data.formats.manifest import (
    DatasetManifest,
    IndexRecord,
    ShardRecord,
    encode_manifest,
    parse_manifest,
)
from mouthguard.data.formats.records import (
    DEFAULT_RANGE,
    MAX_RANGE,
    MIN_RANGE,
    RANGE_ALIGN,
    RangeTable,
)
from mouthguard.data.location import Location, Target, locate
from mouthguard.data.writing.upload import Upload
from mouthguard.errors import DatasetError, DatasetExistsError, ObjectExistsError, SampleError
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.tiers import PutMode
from mouthguard.tiers.object_keys import validate_segment

log = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_SHARD_SIZE = 256 * MiB
#: Small pieces (headers, padding, small members) are sent in chunks of about this size.
_GATHER = 1 * MiB

#: What a sample's member may be: bytes as they are, str as UTF-8, an int as decimal
#: text (class labels), a dict or list as compact JSON with sorted keys.
MemberValue = bytes | bytearray | memoryview | str | int | dict[str, object] | list[object]


def member_bytes(key: str, ext: str, value: object) -> bytes:
    """The stored bytes of one member (see ``MemberValue``).

    Raises:
        SampleError: the value has another type, or JSON cannot encode it.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)  # a copy: the caller may reuse its buffer once write() returns
    if isinstance(value, str):
        return value.encode("utf-8")
    if type(value) is int:
        return str(value).encode("ascii")
    if isinstance(value, dict | list):
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SampleError(f"sample {key!r} member {ext!r}: not JSON-encodable: {exc}") from None
        return text.encode("utf-8")
    raise SampleError(
        f"sample {key!r} member {ext!r} is a {type(value).__name__}; "
        "expected bytes, str, int, or a dict/list (stored as JSON)"
    )


def sample_members(sample: Mapping[str, object]) -> tuple[str, list[tuple[str, bytes]]]:
    """The key and the ``(ext, bytes)`` members of ``sample``, sorted by extension.

    ``__key__`` names the sample; other ``__*__`` entries (WebDataset's ``__url__``,
    ``__local_path__``) are metadata and not stored, as WebDataset's own writer does.

    Raises:
        SampleError: no valid key, no member, or an invalid extension or value.
    """
    key = names.check_key(sample.get("__key__"))
    members: list[tuple[str, bytes]] = []
    for ext in sorted(sample):
        if ext.startswith("__") and ext.endswith("__") and len(ext) > 4:
            continue
        names.check_ext(ext, key)
        members.append((ext, member_bytes(key, ext, sample[ext])))
    if not members:
        raise SampleError(f"sample {key!r} has no members (only its key)")
    return key, members


class _Shard:
    """The shard being written: its upload, offset, samples and a gather buffer."""

    def __init__(self, location: Location, number: int, range_size: int) -> None:
        self.name = names.shard_name(number)
        key = location.key(names.SHARDS_DIR, self.name)
        self.upload = Upload(location.tier, key, range_size=range_size)
        self.offset = 0
        self.samples: list[SampleEntry] = []
        self._buffer = bytearray()

    def add(self, key: str, members: list[tuple[str, bytes, bytes]]) -> None:
        """Append one sample: ``(ext, tar header, data)`` per member."""
        start = self.offset
        entries: list[Member] = []
        for ext, header, data in members:
            self._gather(header)
            entries.append(Member(ext, self.offset, len(data)))
            self._gather(data)
            self._gather(tarfmt.zeros(tarfmt.padding(len(data))))
        self.samples.append(SampleEntry(key, start, self.offset - start, tuple(entries)))

    def _gather(self, data: bytes | memoryview) -> None:
        self.offset += len(data)
        if len(data) >= _GATHER:  # large members go to the tier as they are
            self.flush()
            self.upload.send(bytes(data))
            return
        self._buffer += data
        if len(self._buffer) >= _GATHER:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self.upload.send(bytes(self._buffer))
            self._buffer.clear()

    def finish(self) -> tuple[int, str, tuple[str, ...]]:
        """End the shard: ``(size, sha256, sha256 of each range)``."""
        self._gather(tarfmt.zeros(tarfmt.archive_end(self.offset)))
        self.flush()
        size, sha = self.upload.finish()
        assert size == self.offset, (size, self.offset)  # every byte went through _gather
        return size, sha, self.upload.range_digests()


class ShardWriter:
    """Write a dataset of WebDataset tar shards under ``dest``/``name``; see the module docstring.

    Args:
        dest: a local directory, an ``s3://bucket/prefix`` URL, or a tier.
        name: the dataset's name: a single path segment; the dataset lives in
            ``dest/name/``.
        shard_size: start a new shard before a sample would take the current one
            past this many bytes (a larger sample gets a shard of its own).
        prefix: a key prefix inside ``dest`` (with a tier).
        signing_key: manifest key (``[ID=]KEY[,...]``, bytes or a keyring); default
            ``$MOUTHGUARD_MANIFEST_KEY``. With one, the manifest is signed.
        range_size: the manifest records the sha256 of every range of this many
            bytes of each shard, so readers verify (and hand out) a shard range by
            range (:class:`~mouthguard.data.formats.records.RangeTable`); a multiple of 512
            in [64 KiB, 1 GiB].

    Raises:
        DatasetExistsError: ``dest/name`` already holds a dataset, or debris of one.
    """

    def __init__(
        self,
        dest: Target,
        name: str,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        prefix: str = "",
        signing_key: KeySpec | None = None,
        range_size: int = DEFAULT_RANGE,
    ) -> None:
        if shard_size < tarfmt.RECORD:
            raise ValueError(f"shard_size must be at least {tarfmt.RECORD} bytes")
        if not MIN_RANGE <= range_size <= MAX_RANGE or range_size % RANGE_ALIGN:
            raise ValueError(
                f"range_size must be a multiple of {RANGE_ALIGN} in [{MIN_RANGE}, {MAX_RANGE}]"
            )
        self.range_size = range_size
        validate_segment(name)
        self.name = name
        self.shard_size = shard_size
        self.location = locate(dest, prefix, create=True).child(name)
        self._keys = manifest_keys(signing_key) if signing_key is not None else keys_from_env()
        _refuse_existing(self.location)
        self._shard: _Shard | None = None
        self._records: list[ShardRecord] = []
        self._written: list[str] = []  # every key this writer created: removed on abort
        self._keys_seen: set[str] = set()
        self._extensions: set[str] = set()
        self._closed = False
        self.manifest: DatasetManifest | None = None

    # --- writing -------------------------------------------------------------------

    def write(self, sample: Mapping[str, object]) -> None:
        """Add one sample (``__key__`` plus one entry per extension).

        Raises:
            SampleError: the sample is refused (nothing of it was written).
            TierError: the tier failed; the writer is then aborted.
        """
        if self._closed:
            raise DatasetError(f"writer of {self.location.describe()} is closed")
        key, members = sample_members(sample)
        if key in self._keys_seen:
            raise SampleError(f"sample key {key!r} was already written to this dataset")
        # Headers first: a name USTAR cannot hold is refused before any byte is sent.
        parts = [
            (e, tarfmt.member_header(names.member_name(key, e), len(d)), d) for e, d in members
        ]
        span = sum(tarfmt.BLOCK + len(d) + tarfmt.padding(len(d)) for _, d in members)
        try:
            shard = self._shard
            if shard is not None and shard.samples and shard.offset + span > self.shard_size:
                self._finish_shard()
                shard = None
            if shard is None:
                shard = self._shard = _Shard(self.location, len(self._records), self.range_size)
                self._written.append(shard.upload.key)
            shard.add(key, parts)
        except BaseException:
            self.abort()
            raise
        self._keys_seen.add(key)
        self._extensions.update(ext for ext, _ in members)

    def _finish_shard(self) -> None:
        shard = self._shard
        assert shard is not None
        self._shard = None
        size, sha, ranges = shard.finish()
        index = encode_index(shard.name, size, shard.samples)
        index_name = names.index_name(shard.name)
        index_key = self.location.key(names.SHARDS_DIR, index_name)
        self._written.append(index_key)
        self.location.tier.put(index_key, index, mode=PutMode.CREATE)
        record = ShardRecord(
            shard.name,
            size,
            sha,
            len(shard.samples),
            IndexRecord(index_name, len(index), hashlib.sha256(index).hexdigest()),
            RangeTable(self.range_size, ranges),
        )
        self._records.append(record)
        log.debug("dataset %s: %s committed (%d samples)", self.name, shard.name, record.samples)

    # --- committing ------------------------------------------------------------------

    def close(self) -> DatasetManifest:
        """Finish the last shard and commit: ``dataset.json``, last and create-only.

        Returns the committed manifest (also in :attr:`manifest`). Idempotent once
        committed.

        Raises:
            DatasetError: nothing was written (an empty dataset is not committed).
            DatasetExistsError: another writer committed this dataset meanwhile.
        """
        if self.manifest is not None:
            return self.manifest
        if self._closed:
            raise DatasetError(f"writer of {self.location.describe()} was aborted")
        try:
            if self._shard is not None:
                self._finish_shard()
            self._refuse_empty()
            manifest_bytes = encode_manifest(
                self.name,
                self._records,
                sorted(self._extensions),
                created=dt.datetime.now(dt.UTC),
                keys=self._keys,
            )
            # Re-parsed as any reader will, before it becomes the commit.
            manifest = parse_manifest(manifest_bytes, self._keys)
            key = self.location.key(names.MANIFEST_NAME)
            try:
                self.location.tier.put(key, manifest_bytes, mode=PutMode.CREATE)
            except ObjectExistsError:
                raise DatasetExistsError(
                    f"a dataset was committed at {self.location.describe()} meanwhile"
                ) from None
        except BaseException:
            self.abort()
            raise
        self._closed = True
        self.manifest = manifest
        return manifest

    def _refuse_empty(self) -> None:
        if not self._records:
            raise DatasetError(f"nothing to commit at {self.location.describe()}: no samples")

    def abort(self) -> None:
        """Abandon the dataset: stop the upload in flight and remove every object written."""
        if self.manifest is not None:
            return
        self._closed = True
        if self._shard is not None:
            self._shard.upload.abort()
            self._shard = None
        for key in reversed(self._written):
            try:
                self.location.tier.delete(key)
            except Exception as exc:  # noqa: BLE001 - best effort: the debris stays invisible
                log.warning("could not remove %s after an aborted write: %s", key, exc)
        self._written.clear()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _refuse_existing(location: Location) -> None:
    tier = location.tier
    if tier.exists(location.key(names.MANIFEST_NAME)):
        raise DatasetExistsError(f"a dataset is already committed at {location.describe()}")
    debris = next(iter(tier.list(location.prefix + "/")), None)
    if debris is not None:
        raise DatasetExistsError(
            f"{location.describe()} holds objects of an uncommitted dataset (e.g. {debris}): "
            "another writer is at work there, or one failed; remove them with "
            "mouthguard.data.discard_incomplete() to write there"
        )


def discard_incomplete(dest: Target, name: str, *, prefix: str = "") -> int:
    """Remove the debris of an uncommitted dataset ``dest/name``; return how many objects.

    Never touches a committed dataset. Call it only when no writer is at work
    there: a writer in progress would lose its shards (and fail at its commit).

    Raises:
        DatasetExistsError: ``dest/name`` holds a committed dataset.
    """
    validate_segment(name)
    location = locate(dest, prefix, write=True).child(name)
    if location.tier.exists(location.key(names.MANIFEST_NAME)):
        raise DatasetExistsError(f"{location.describe()} is a committed dataset: not debris")
    return location.tier.delete_prefix(location.prefix + "/")
