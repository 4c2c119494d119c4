"""A committed dataset, opened: its location and its verified manifest.

:func:`open_dataset` reads ``dataset.json``, checks it as hostile input (seal,
signature when a manifest key is configured, every field; see
:mod:`~mouthguard.data.formats.manifest`) and returns a :class:`Dataset`. Nothing else
is read: shards are verified by whoever reads them (the loader before yielding a
sample of one, :func:`~mouthguard.data.verify.verify_dataset` for all of them).

A dataset is opened where its data is: a packed dataset's prefix (manifest at
``dataset.json``), or the directory of an adopted one (manifest at
``mouthguard-index/dataset.json``, data files named relative to the directory).
Each manifest must be where its layout says: an adopted manifest found at the
top (someone opened ``SRC/mouthguard-index`` itself) would resolve the user's
files in the wrong place, and is refused with a pointer to ``SRC``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mouthguard.data.formats import names
from mouthguard.data.formats.index import ShardIndex, parse_index
from mouthguard.data.formats.manifest import (
    MAX_MANIFEST_BYTES,
    DatasetManifest,
    ParquetRecord,
    ShardRecord,
    parse_manifest,
)
from mouthguard.data.location import Location, Target, locate
from mouthguard.errors import (
    DatasetNotFoundError,
    ManifestError,
    ObjectNotFoundError,
    ShardDamagedError,
)
from mouthguard.format.signing import KeySpec, keys_from_env, manifest_keys
from mouthguard.tiers.key_material import Keyring

#: An index larger than this is refused unread (a quarter-million samples take a few MiB).
MAX_INDEX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Dataset:
    """A committed dataset: where it is and what its verified manifest says."""

    location: Location
    manifest: DatasetManifest

    @property
    def name(self) -> str:
        """The dataset's name."""
        return self.manifest.name

    @property
    def shards(self) -> tuple[ShardRecord, ...]:
        """The shards, in order."""
        return self.manifest.shards

    @property
    def files(self) -> tuple[ParquetRecord, ...]:
        """The Parquet files, in order (empty for WebDataset)."""
        return self.manifest.files

    @property
    def samples(self) -> int:
        """Samples (Parquet: rows) in the dataset."""
        return self.manifest.samples

    @property
    def nbytes(self) -> int:
        """Bytes of all shards."""
        return self.manifest.nbytes

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` naming the content (``formats.manifest.fingerprint``)."""
        return self.manifest.fingerprint

    def shard_key(self, shard: ShardRecord) -> str:
        """The tier key of ``shard`` (adopted: the user's file, where it is)."""
        if self.manifest.adopted:
            return self.location.key(shard.name)
        return self.location.key(names.SHARDS_DIR, shard.name)

    def index_key(self, shard: ShardRecord) -> str:
        """The tier key of ``shard``'s index."""
        if self.manifest.adopted:
            return self.location.key(names.INDEX_DIR, names.SHARDS_DIR, shard.index.name)
        return self.location.key(names.SHARDS_DIR, shard.index.name)

    def file_key(self, record: ParquetRecord) -> str:
        """The tier key of a Parquet file (the user's, where it is)."""
        return self.location.key(record.name)

    def read_index(self, shard: ShardRecord) -> ShardIndex:
        """Read ``shard``'s index from the tier, check it against the manifest, parse it.

        Raises:
            ShardDamagedError: missing, wrong size or sha256, or malformed.
            TierError: the tier could not be read (not damage).
        """
        try:
            raw = self.location.tier.get(self.index_key(shard))
        except ObjectNotFoundError:
            raise ShardDamagedError(
                f"shard {shard.name}: index {shard.index.name} is missing", shard=shard.name
            ) from None
        return check_index(shard, raw, adopted=self.manifest.adopted)


def check_index(shard: ShardRecord, raw: bytes, *, adopted: bool = False) -> ShardIndex:
    """``raw`` as ``shard``'s index: size and sha256 against the manifest, then parsed.

    ``adopted``: the shard is a user's tar (:func:`~mouthguard.data.formats.index.parse_index`).

    Raises:
        ShardDamagedError: any mismatch; the message names the shard.
    """
    if len(raw) != shard.index.size or len(raw) > MAX_INDEX_BYTES:
        raise ShardDamagedError(
            f"shard {shard.name}: index is {len(raw)} bytes, the manifest says {shard.index.size}",
            shard=shard.name,
        )
    if hashlib.sha256(raw).hexdigest() != shard.index.sha256:
        raise ShardDamagedError(
            f"shard {shard.name}: index sha256 does not match the manifest", shard=shard.name
        )
    # A gzip-compressed shard's index counts in the tar inside: the index states its size.
    size = None if names.is_gzip_tar(shard.name) else shard.size
    return parse_index(raw, shard=shard.name, size=size, count=shard.samples, adopted=adopted)


def manifest_key(location: Location) -> str | None:
    """The key of the manifest at ``location``: packed, adopted, or None (nothing committed).

    Raises:
        TierError: the tier could not be read.
    """
    for key in (
        location.key(names.MANIFEST_NAME),
        location.key(names.INDEX_DIR, names.MANIFEST_NAME),
    ):
        if location.tier.exists(key):
            return key
    return None


def read_manifest(location: Location, keys: Keyring | None) -> DatasetManifest:
    """Read and verify the manifest at ``location``.

    Raises:
        DatasetNotFoundError: there is no ``dataset.json`` (nothing committed there).
        ManifestError: too large, corrupt, inconsistent; SignatureError (a
            ManifestError) when a key is configured and the signature fails.
        TierError: the tier could not be read.
    """
    key = manifest_key(location)
    try:
        if key is None:  # one message for "none there" and "gone since we looked"
            raise ObjectNotFoundError(names.MANIFEST_NAME)  # noqa: TRY301
        size = location.tier.head(key).size
        if size > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"dataset manifest at {location.describe()} is {size} bytes: over the limit"
            )
        raw = location.tier.get(key)
    except ObjectNotFoundError:
        raise DatasetNotFoundError(
            f"no dataset at {location.describe()} (no {names.MANIFEST_NAME}, nor "
            f"{names.INDEX_DIR}/{names.MANIFEST_NAME}: nothing committed or indexed)"
        ) from None
    manifest = parse_manifest(raw, keys)
    in_index_dir = key.endswith(f"{names.INDEX_DIR}/{names.MANIFEST_NAME}")
    if manifest.adopted and not in_index_dir:
        raise DatasetNotFoundError(
            f"{location.describe()} holds the index of an adopted dataset, not the dataset: "
            "open the directory that holds it (the parent of this one)"
        )
    if in_index_dir and not manifest.adopted:
        raise ManifestError(
            f"dataset manifest at {location.describe()}/{names.INDEX_DIR} is a packed one: "
            f"packed datasets keep theirs at the top, {names.INDEX_DIR}/ is for adopted ones"
        )
    return manifest


def resolve_keys(signing_key: KeySpec | None) -> Keyring | None:
    """The manifest keys: ``signing_key`` if given, else ``$MOUTHGUARD_MANIFEST_KEY``."""
    return manifest_keys(signing_key) if signing_key is not None else keys_from_env()


def open_dataset(
    source: Target, *, prefix: str = "", signing_key: KeySpec | None = None
) -> Dataset:
    """Open the committed dataset at ``source`` (+ ``prefix``), its manifest verified.

    Args:
        source: the dataset's directory, its ``s3://bucket/prefix`` URL, or a tier.
        prefix: the dataset's key prefix inside ``source``.
        signing_key: manifest keys; default ``$MOUTHGUARD_MANIFEST_KEY``. With a
            key, the manifest must carry a valid signature.

    Raises:
        DatasetNotFoundError: nothing is committed there.
        ManifestError: the manifest is damaged, hostile or (with a key) unsigned.
    """
    location = locate(source, prefix)
    return Dataset(location, read_manifest(location, resolve_keys(signing_key)))


def open_at(location: Location, keys: Keyring | None) -> Dataset:
    """The dataset at an already opened ``location``."""
    return Dataset(location, read_manifest(location, keys))
