"""``index_dataset``: adopt a dataset the user already has, in place, without repacking.

The user's files stay exactly where and what they are. Beside them, under
``SRC/mouthguard-index/`` (:data:`~mouthguard.data.formats.names.INDEX_DIR`), go the
same verified artefacts a packed dataset has: per tar an index
(``shards/<path>.index.json``), and last, create-only, the manifest
``dataset.json`` -- its presence is the commit, as for packed datasets. Then
``StreamingDataset(SRC)``, ``verify_dataset(SRC)`` and ``mouthguard data
verify SRC`` serve the adopted dataset with every guarantee of a packed one.

What is adopted (``kind``; default: whatever SRC holds):

* ``webdataset``: every ``*.tar`` under SRC, in sorted key order, each read
  once and parsed by ``tarfile`` as hostile input (:mod:`~mouthguard.data.indexing.tarscan`);
  ``*.tar.gz`` and ``*.tgz`` too, inflated as they are read
  (:mod:`~mouthguard.data.reading.gztar`): their index counts offsets in the tar inside,
  and they are verified whole (gzip cannot be read from the middle);
* ``parquet``: every ``*.parquet`` under SRC, in sorted key order, each read
  once: footer, row-group byte ranges, and a sha256 of the file, its footer
  and every row group (:mod:`~mouthguard.data.indexing.pqindex`; needs pyarrow).

Files are named by their path relative to SRC. The tier only lists names that
are valid keys (:mod:`mouthguard.tiers.object_keys`) and regular files, so a
local SRC is also walked directly, and a data file the tier would not see (a
symbolic link, a name with spaces) is refused by name rather than silently
left out. Hidden paths (a segment starting with a dot) are skipped, as ``pack``
skips them. Files must not change while they are indexed.

All or nothing: a failure removes every index written, and nothing is
committed. A process killed meanwhile leaves indexes without ``dataset.json``;
a new ``index_dataset`` refuses SRC until they are removed
(``discard_incomplete(SRC, "mouthguard-index")``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

from mouthguard.data.dataset import manifest_key, resolve_keys
from mouthguard.data.fetching.ranged import DEFAULT_PARALLEL, DEFAULT_RANGE_SIZE, read_ranges
from mouthguard.data.formats import names
from mouthguard.data.formats.arrow import pyarrow_modules
from mouthguard.data.formats.index import encode_index
from mouthguard.data.formats.manifest import (
    INDEXED,
    DatasetManifest,
    encode_manifest,
    encode_parquet_manifest,
    parse_manifest,
)
from mouthguard.data.formats.rangehash import FixedRanges
from mouthguard.data.formats.records import (
    DEFAULT_RANGE,
    IndexRecord,
    ParquetRecord,
    RangeTable,
    ShardRecord,
)
from mouthguard.data.indexing.tarscan import scan_tar
from mouthguard.data.location import Location, locate
from mouthguard.data.reading.gztar import GzipError, gunzip
from mouthguard.errors import (
    AdoptionError,
    DatasetExistsError,
    DatasetNotFoundError,
    InvalidKeyError,
    ObjectExistsError,
)
from mouthguard.format.signing import KeySpec
from mouthguard.tiers import PutMode
from mouthguard.tiers.key_material import Keyring
from mouthguard.tiers.local import LocalTier
from mouthguard.tiers.object_keys import is_valid_key, validate_segment

log = logging.getLogger(__name__)

Kind = Literal["webdataset", "parquet"]
_T = TypeVar("_T")
SUFFIXES: dict[str, tuple[str, ...]] = {
    "webdataset": names.TAR_SUFFIXES,
    "parquet": (".parquet",),
}


def _default_name(src: object) -> str:
    """The last part of ``src``: a directory's name, an ``s3://`` URL's last segment."""
    text = os.fspath(src) if isinstance(src, str | os.PathLike) else str(src)
    last = (
        text.rstrip("/").rsplit("/", 1)[-1]
        if text.startswith("s3://")
        else Path(text).resolve().name
    )
    try:
        return validate_segment(last)
    except InvalidKeyError:
        raise AdoptionError(
            f"{last!r} (the last part of {text}) cannot name a dataset: pass name="
        ) from None


def _listing(location: Location) -> list[str]:
    """Every object under the location, relative to it, outside the index directory."""
    base = f"{location.prefix}/" if location.prefix else ""
    found = []
    for key in location.tier.list(base):
        rel = key[len(base) :]
        if rel.split("/", 1)[0] != names.INDEX_DIR:
            found.append(rel)
    return found


def _unseen_local(root: Path, suffix: tuple[str, ...]) -> list[str]:
    """Data files under a local ``root`` the tier does not list: links, names that are no keys."""
    unseen: list[str] = []
    for directory, dirs, files in os.walk(root):  # never follows a directory link
        top = Path(directory) == root
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (top and d == names.INDEX_DIR)]
        for file in files:
            path = Path(directory, file)
            rel = path.relative_to(root).as_posix()
            if file.startswith(".") or not file.endswith(suffix):
                continue
            if path.is_symlink() or not is_valid_key(rel):
                unseen.append(rel)
    return sorted(unseen)


def data_paths(location: Location, kind: str) -> list[str]:
    """The paths of the data files of ``kind`` the tier lists under ``location``, sorted."""
    return [p for p in _listing(location) if p.endswith(SUFFIXES[kind])]


def data_files(location: Location, kind: str | None) -> tuple[str, list[str]]:
    """``(kind, paths)``: the data files under ``location``, sorted (see the module docstring).

    Raises:
        DatasetNotFoundError: no data files of the kind.
        ValueError: both kinds and no ``kind`` to say which.
        AdoptionError: a data file the tier cannot see (named).
    """
    listing = _listing(location)
    found = {k: [p for p in listing if p.endswith(s)] for k, s in SUFFIXES.items()}
    if kind is None:
        present = [k for k, paths in found.items() if paths]
        if len(present) > 1:
            raise ValueError(
                f"{location.describe()} holds both .tar and .parquet files: say which to index "
                "(kind='webdataset' or kind='parquet', --kind on the command line)"
            )
        kind = present[0] if present else "webdataset"
    if kind not in SUFFIXES:
        raise ValueError(f"kind must be 'webdataset' or 'parquet', not {kind!r}")
    if isinstance(location.tier, LocalTier):
        unseen = _unseen_local(location.tier.root / location.prefix, SUFFIXES[kind])
        if unseen:
            shown = ", ".join(unseen[:5]) + (
                f" and {len(unseen) - 5} more" if len(unseen) > 5 else ""
            )
            raise AdoptionError(
                f"cannot index {shown}: only regular files whose paths use letters, digits and "
                "_ . = + - (no spaces, no symbolic links) can be indexed in place"
            )
    if not found[kind]:
        first, *others = SUFFIXES[kind]
        nor = f" (nor {', '.join(others)})" if others else ""
        raise DatasetNotFoundError(
            f"no {first} files{nor} under {location.describe()}: nothing to index"
        )
    if kind == "webdataset":
        _refuse_shared_indexes(found[kind])
    return kind, found[kind]


def _refuse_shared_indexes(paths: Sequence[str]) -> None:
    """AdoptionError naming two tars whose index would be one file (``x.tar`` and ``x.tgz``)."""
    seen: dict[str, str] = {}
    for path in paths:
        index_name = names.adopted_index_name(path)
        other = seen.setdefault(index_name, path)
        if other != path:
            raise AdoptionError(
                f"{other} and {path} would share the index {index_name}: keep one of them "
                "(the same tar, compressed and not?) or rename the other"
            )


class _Indexer:
    """One adoption in progress: what it wrote (removed if it fails), and progress."""

    def __init__(self, location: Location, progress: Callable[[int], None] | None) -> None:
        self.location = location
        self.index_location = location.child(names.INDEX_DIR)
        self.written: list[str] = []
        self._lock = threading.Lock()
        self._done = 0
        self._progress = progress
        self.range_size = DEFAULT_RANGE_SIZE
        self.parallel = DEFAULT_PARALLEL

    def on_bytes(self, n: int) -> None:
        with self._lock:
            self._done += n
            done = self._done
        if self._progress is not None:
            self._progress(done)

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.written.append(key)
        self.location.tier.put(key, data, mode=PutMode.CREATE)

    def tar(self, path: str) -> tuple[ShardRecord, set[str]]:
        tier, key = self.location.tier, self.location.key(path)
        size = tier.head(key).size
        chunks = read_ranges(
            tier, key, size, shard=path, range_size=self.range_size, parallel=self.parallel
        )
        if names.is_gzip_tar(path):
            return self._gzip_tar(path, size, (data for _, data in chunks))
        ranges = FixedRanges(DEFAULT_RANGE)  # the same bytes the scan hashes, in order

        def fed() -> Iterator[bytes]:
            for _, data in chunks:
                ranges.feed(data)
                yield data

        scan = scan_tar(fed(), size, path, on_bytes=self.on_bytes)
        index = encode_index(path, size, scan.samples)
        index_name = names.adopted_index_name(path)
        self.put(self.index_location.key(names.SHARDS_DIR, index_name), index)
        digest = hashlib.sha256(index).hexdigest()
        record = ShardRecord(
            path,
            size,
            scan.sha256,
            len(scan.samples),
            IndexRecord(index_name, len(index), digest),
            RangeTable(DEFAULT_RANGE, ranges.digests()),
        )
        return record, {m.ext for s in scan.samples for m in s.members}

    def _gzip_tar(
        self, path: str, size: int, chunks: Iterator[bytes]
    ) -> tuple[ShardRecord, set[str]]:
        """A ``.tar.gz`` / ``.tgz``: hashed as stored, scanned as inflated; no range table."""
        digest = hashlib.sha256()

        def fed() -> Iterator[bytes]:
            for data in chunks:
                digest.update(data)
                self.on_bytes(len(data))  # progress counts the file's bytes, not the tar's
                yield data

        try:
            scan = scan_tar(gunzip(fed()), None, path)
        except GzipError as exc:
            raise AdoptionError(f"{path}: {exc}") from None
        index = encode_index(path, scan.size, scan.samples)
        index_name = names.adopted_index_name(path)
        self.put(self.index_location.key(names.SHARDS_DIR, index_name), index)
        record = ShardRecord(
            path,
            size,
            digest.hexdigest(),
            len(scan.samples),
            IndexRecord(index_name, len(index), hashlib.sha256(index).hexdigest()),
            None,  # gzip cannot be range-read: verified whole
        )
        return record, {m.ext for s in scan.samples for m in s.members}

    def parquet(self, path: str) -> tuple[ParquetRecord, tuple[str, ...]]:
        from mouthguard.data.indexing.pqindex import scan_parquet  # noqa: PLC0415 - pyarrow when used

        tier, key = self.location.tier, self.location.key(path)
        scan = scan_parquet(
            tier,
            key,
            tier.head(key).size,
            path,
            range_size=self.range_size,
            parallel=self.parallel,
            on_bytes=self.on_bytes,
        )
        return scan.record, scan.columns

    def abort(self) -> None:
        for key in reversed(self.written):
            try:
                self.location.tier.delete(key)
            except Exception as exc:  # noqa: BLE001 - best effort: the debris stays invisible
                log.warning("could not remove %s after a failed index: %s", key, exc)


def _refuse_existing(location: Location, *, again: bool) -> None:
    """Refuse a packed dataset; an indexed one or the debris of a run, unless ``again``.

    ``again``: remove what ``mouthguard-index/`` holds first -- the manifest
    before the indexes, so a reader meanwhile finds no dataset rather than one
    whose indexes are going.
    """
    found = manifest_key(location)
    index_dir = location.child(names.INDEX_DIR)
    if found is not None and names.INDEX_DIR not in found:
        raise DatasetExistsError(
            f"{location.describe()} is a packed dataset ({found}): nothing to adopt"
        )
    if again:
        if found is not None:
            location.tier.delete(found)
        removed = location.tier.delete_prefix(index_dir.prefix + "/")
        log.info("index again: removed %d objects under %s", removed, index_dir.describe())
        return
    if found is not None:
        raise DatasetExistsError(
            f"{location.describe()} is already indexed ({found}): to index it again (files "
            f"added or changed), run mouthguard data index --again {location.describe()} "
            f"(index_dataset(..., again=True)); it replaces only {index_dir.describe()}/ -- "
            "the indexes and the manifest; the data files are not touched"
        )
    debris = next(iter(location.tier.list(index_dir.prefix + "/")), None)
    if debris is not None:
        raise DatasetExistsError(
            f"{index_dir.describe()} holds indexes of an unfinished index run (e.g. {debris}): "
            "another run is at work, or one failed; if none is at work, run mouthguard data "
            f"index --again {location.describe()} (or remove them with "
            f"mouthguard.data.discard_incomplete(SRC, {names.INDEX_DIR!r}))"
        )


def index_dataset(
    src: str | os.PathLike[str],
    *,
    name: str | None = None,
    kind: Kind | None = None,
    signing_key: KeySpec | None = None,
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
    again: bool = False,
) -> DatasetManifest:
    """Index the dataset the user has at ``src`` in place; return the committed manifest.

    Args:
        src: the directory, or ``s3://bucket/prefix``, holding the data files.
        name: the dataset's name (default: the last part of ``src``).
        kind: ``webdataset`` (``*.tar``) or ``parquet`` (``*.parquet``); default:
            whichever ``src`` holds.
        signing_key: manifest keys; default ``$MOUTHGUARD_MANIFEST_KEY``. With
            one, the manifest is signed.
        workers: files read at once (each with several concurrent range reads).
        progress: called with the bytes read so far, as they are read.
        again: index a dataset indexed before (its files added or changed) or the
            debris of an unfinished run: what ``mouthguard-index/`` holds is removed
            first (never the data files). Only when no other index run is at work
            there. Removed, it stays removed if this run then fails (run it again).

    Raises:
        DatasetNotFoundError: ``src`` is not a directory, or holds no data files.
        ValueError: ``src`` holds both kinds and ``kind`` does not say which.
        DatasetExistsError: ``src`` is a packed dataset; or, without ``again``,
            already indexed or holding the debris of an unfinished index run.
        AdoptionError: a data file cannot be indexed as it is (names it and why).
        MissingDependencyError: Parquet, and pyarrow is not installed.
    """
    location = locate(src, write=True)  # a local path that is not a directory: DatasetNotFoundError
    dataset_name = validate_segment(name) if name is not None else _default_name(src)
    keys = resolve_keys(signing_key)
    if not again:
        _refuse_existing(location, again=False)
    found_kind, paths = data_files(location, kind)
    if found_kind == "parquet":
        pyarrow_modules()  # without it: one line saying what to install, before any read
    if again:  # the old index goes only once what to index is known to be there
        _refuse_existing(location, again=True)
    indexer = _Indexer(location, progress)
    try:
        raw = _index(indexer, found_kind, paths, dataset_name, keys=keys, workers=workers)
        manifest = parse_manifest(raw, keys)  # as any reader will, before it becomes the commit
        try:
            location.tier.put(
                indexer.index_location.key(names.MANIFEST_NAME), raw, mode=PutMode.CREATE
            )
        except ObjectExistsError:
            raise DatasetExistsError(f"{location.describe()} was indexed meanwhile") from None
    except BaseException:
        indexer.abort()
        raise
    return manifest


def _in_order(fn: Callable[[str], _T], paths: Sequence[str], workers: int) -> list[_T]:
    """``fn`` over ``paths`` on ``workers`` threads, the results in order.

    The first failure cancels what has not started; what runs finishes, and the
    caller's abort removes what it wrote.
    """
    # Not io.pool.SHARED: a job writes its index with tier.put, whose large writes run
    # on SHARED (io.direct_write) and are waited for; jobs on SHARED would deadlock.
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="index")
    try:
        futures = [pool.submit(fn, path) for path in paths]
        return [future.result() for future in futures]
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def _index(
    indexer: _Indexer,
    kind: str,
    paths: Sequence[str],
    name: str,
    *,
    keys: Keyring | None,
    workers: int,
) -> bytes:
    created = dt.datetime.now(dt.UTC)
    if kind == "parquet":
        scans = _in_order(indexer.parquet, paths, workers)
        files = [record for record, _ in scans]
        if not any(f.rows for f in files):
            raise AdoptionError(
                f"the .parquet files under {indexer.location.describe()} hold no rows"
            )
        columns = sorted({c for _, cols in scans for c in cols})
        return encode_parquet_manifest(name, files, columns, created=created, keys=keys)
    tars = _in_order(indexer.tar, paths, workers)
    extensions = sorted({ext for _, exts in tars for ext in exts})
    shards = [record for record, _ in tars]
    return encode_manifest(name, shards, extensions, created=created, keys=keys, layout=INDEXED)
