"""S3Tier: the Tier contract kept over an S3 bucket.

How each promise of :mod:`mouthguard.tiers.base` is kept (all-or-nothing put,
streams copied once, create-only put, checked ranges, listing through botocore,
no rename) is written in the package docstring, :mod:`mouthguard.tiers.s3`;
this module composes the package's other modules into the tier.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import obstore
from typing_extensions import override

from mouthguard.errors import ObjectExistsError, TierError
from mouthguard.tiers.base import (
    ObjectInfo,
    PutData,
    PutMode,
    Tier,
    TierCapabilities,
)
from mouthguard.tiers.object_keys import (
    is_valid_key,
    is_valid_segment,
    validate_dir_prefix,
    validate_key,
    validate_prefix,
)
from mouthguard.tiers.ranges import check_range
from mouthguard.tiers.s3.connect import connect
from mouthguard.tiers.s3.control import check_tags, etag
from mouthguard.tiers.s3.create import CreateGuard, create_with_retries, settle_versioned_create
from mouthguard.tiers.s3.errors import OBSTORE_ERRORS
from mouthguard.tiers.s3.parts import put_payload
from mouthguard.tiers.s3.probe import S3Probe, probe_bucket, unprobed
from mouthguard.tiers.s3.versions import version_history

if TYPE_CHECKING:
    from obstore import GetOptions, GetResult, PutResult

__all__ = ["S3Tier"]

MiB = 1024 * 1024
#: S3's smallest part (except the last) and largest single PUT.
MIN_PART_SIZE, MAX_PART_SIZE = 5 * MiB, 5 * 1024 * MiB
#: ``annotate`` writes tag ``importance`` as S3 tag ``mouthguard-importance``.
TAG_PREFIX = "mouthguard-"
# Granularity of the copy into a read_into target: bounds the bytes in flight.
_READ_CHUNK = 4 * MiB


class S3Tier(Tier):
    """A tier over an S3 bucket (AWS, Ceph RGW, MinIO, ...), optionally under a prefix.

    Opening the tier checks that the bucket exists (a missing bucket or a dead
    endpoint fails within seconds) and probes what the server really does; the
    findings are in :attr:`probe` and in :attr:`capabilities`.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``; keys live under the prefix.
        name: the tier's name in the store configuration.
        domain: the failure domain of the bucket.
        endpoint: ``http(s)://host:port`` of an S3-compatible server; default
            ``$AWS_ENDPOINT_URL_S3``, ``$AWS_ENDPOINT_URL``, else AWS itself.
            Plain HTTP is allowed only when the endpoint says ``http://``.
        region: default ``$AWS_REGION``, ``$AWS_DEFAULT_REGION``, else ``us-east-1``.
        access_key_id: default ``$AWS_ACCESS_KEY_ID``; with neither, the SDKs'
            default credential chains apply (instance profiles, ...).
        secret_access_key: default ``$AWS_SECRET_ACCESS_KEY``.
        session_token: default ``$AWS_SESSION_TOKEN``.
        max_retries: retries of a failed request (throttling, 5xx, connection
            errors, timeouts), with exponential backoff and jitter.
        retry_timeout: seconds after a request's first attempt when retrying stops.
        backoff_initial: first backoff delay in seconds (doubling up to ``backoff_max``).
        backoff_max: longest backoff delay in seconds.
        connect_timeout: seconds to establish a connection.
        request_timeout: seconds for one whole request, body included (one part
            of a multipart upload, or a whole single PUT or GET).
        part_size: bytes per multipart part (>= 5 MiB); larger objects use multipart.
        max_concurrency: parts uploaded at once; memory in flight is about
            ``part_size * (max_concurrency + 2)``.
        read_only: the tier only reads (a dataset reader, a restore): the
            write probe is skipped, so nothing is written to the bucket at open
            and read-only credentials suffice; every write, delete, tag or hold
            raises :class:`~mouthguard.errors.TierError`. :attr:`probe` then says
            it measured nothing.
        check_bucket: check at open that the bucket exists (default). False
            only where another process opened and checked the same bucket
            moments ago (a DataLoader worker reopening its parent's tier): the
            check's request and its client are spared, and a missing bucket
            fails the first request instead.

    Attributes:
        bucket: the bucket name.
        prefix: the key prefix inside the bucket, ``""`` or ending with ``/``.
        probe: what the open-time probe measured (:class:`S3Probe`).

    Raises:
        TierError: the URL or endpoint is malformed, the bucket does not exist,
            the endpoint cannot be reached, or access is denied.
        ValueError: a numeric setting is out of range.
    """

    def __init__(
        self,
        url: str,
        name: str = "s3",
        domain: str = "s3",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        max_retries: int = 5,
        retry_timeout: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        connect_timeout: float = 5.0,
        request_timeout: float = 300.0,
        part_size: int = 16 * MiB,
        max_concurrency: int = 4,
        read_only: bool = False,
        check_bucket: bool = True,
    ) -> None:
        super().__init__(name, domain)
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(f"part_size must be between 5 MiB and 5 GiB, got {part_size}")
        if max_concurrency < 1 or max_retries < 0:
            raise ValueError("max_concurrency must be >= 1 and max_retries >= 0")
        if min(retry_timeout, backoff_initial, backoff_max, connect_timeout, request_timeout) <= 0:
            raise ValueError("timeouts and backoff delays must be positive")
        self._part_size, self._max_concurrency = part_size, max_concurrency
        self._retries, self._backoff = max_retries, (backoff_initial, backoff_max)
        self._control, self._store = connect(
            url,
            endpoint=endpoint,
            region=region,
            keys=(access_key_id, secret_access_key, session_token),
            timeouts=(connect_timeout, request_timeout),
            max_retries=max_retries,
            retry_timeout=retry_timeout,
            backoff=(backoff_initial, backoff_max),
            check=check_bucket,
        )
        self.bucket, self.prefix = self._control.bucket, self._control.prefix
        self.endpoint = self._control.endpoint
        self.read_only = read_only
        self.probe: S3Probe = (
            unprobed(self._control, "the tier was opened read-only")
            if read_only
            else probe_bucket(self._control, self._store)
        )
        self._guard = self.probe.create_guard
        # Removing a lost create's version under a default GOVERNANCE retention needs a bypass.
        self._bypass = (self.probe.default_retention or "").startswith("GOVERNANCE")
        self._capabilities = TierCapabilities(
            atomic_rename=False,
            conditional_put=self._guard.atomic,
            object_lock=self.probe.object_lock,
            durable=True,
            persistent=True,
        )

    @property
    @override
    def capabilities(self) -> TierCapabilities:
        """No atomic rename; atomic create and object lock as probed; durable."""
        return self._capabilities

    @override
    def location(self, prefix: str = "") -> str:
        """Return ``s3://bucket/<tier prefix><prefix>``."""
        validate_prefix(prefix)
        return f"s3://{self.bucket}/{self.prefix}{prefix}"

    @override
    def __repr__(self) -> str:
        return (
            f"S3Tier(name={self.name!r}, location={self.location()!r}, endpoint={self.endpoint!r})"
        )

    def _check_writable(self, what: str, key: str) -> None:
        if self.read_only:
            raise TierError(f"cannot {what} {key!r}: {self.location()} was opened read-only")

    # --- the data plane --------------------------------------------------------------

    @override
    def put(
        self,
        key: str,
        data: PutData,
        *,
        mode: PutMode = PutMode.OVERWRITE,
        tags: Mapping[str, str] | None = None,
    ) -> ObjectInfo:
        """Store ``data`` under ``key``, all-or-nothing (see the module docstring).

        Args:
            key: the object key.
            data: one buffer or an iterable of buffers.
            mode: ``CREATE`` refuses an existing key, atomically where
                ``capabilities.conditional_put`` (see :attr:`probe`'s ``create_guard``).
            tags: S3 object tags to store with the object: in the same request
                for a single PUT, set right after completion for a multipart upload.

        Raises:
            InvalidKeyError: ``key`` is invalid.
            ObjectExistsError: ``mode`` is CREATE and ``key`` exists, or another
                creator of ``key`` won the race (its bytes stay, ours are removed).
            TierError: the upload failed (nothing is published), the outcome of a
                create could not be settled, or the tags of a multipart object
                could not be set (the object itself is stored).
        """
        self._check_writable("put", key)
        validate_key(key)
        tag_dict = check_tags(tags)
        create = mode is PutMode.CREATE
        if create and self._guard is not CreateGuard.IF_NONE_MATCH and self.exists(key):
            raise ObjectExistsError(f"object {key!r} already exists in {self.location()}")
        # obstore sends If-None-Match on single PUTs only; the other guards work with any.
        single = create and self._guard is CreateGuard.IF_NONE_MATCH
        payload, size, stream, multipart = put_payload(data, self._part_size, single=single)

        def send() -> PutResult:
            try:
                return obstore.put(
                    self._store,
                    key,
                    payload,
                    mode="create" if create and not multipart else "overwrite",
                    tags=None if multipart else tag_dict,
                    use_multipart=multipart,
                    chunk_size=self._part_size,
                    max_concurrency=self._max_concurrency,
                )
            except Exception as exc:
                if stream is not None and stream.error is not None:
                    raise stream.error from None  # the caller's own failure, unchanged
                if isinstance(exc, OBSTORE_ERRORS):
                    raise self._control.store_error("store", key, exc) from exc
                raise

        result: PutResult | None
        if single and isinstance(payload, memoryview | bytearray):
            # Not idempotent, so the client will not retry it: settle it here (None:
            # an earlier attempt landed, its reply lost).
            result = create_with_retries(
                send,
                lambda: self.get(key) if self.exists(key) else None,
                memoryview(payload),
                retries=self._retries,
                backoff=self._backoff,
            )
        else:
            result = send()
        self._after_put(key, result, create=create, tags=tag_dict if multipart else None)
        stamp = etag(result.get("e_tag")) if result is not None else None
        return ObjectInfo(key, size if stream is None else stream.size, None, stamp)

    def _after_put(
        self, key: str, result: PutResult | None, *, create: bool, tags: dict[str, str] | None
    ) -> None:
        """Settle a create on a versioned bucket, and tag a multipart object (``tags``)."""
        # On a versioned bucket the latest version may already be another writer's.
        versioned = result is not None and self.probe.versioning == "Enabled"
        version = result.get("version") if versioned and result is not None else None
        if create and self._guard is CreateGuard.OLDEST_VERSION:
            settle_versioned_create(self._control, key, version, bypass_governance=self._bypass)
        if tags:
            self._control.put_tags(key, tags, version)  # on failure: stored, but untagged

    def _open_range(self, key: str, start: int, end: int | None) -> GetResult | None:
        """Start a GET of ``[start, end)``; ``None`` for a valid empty range."""
        validate_key(key)
        if start < 0 or (end is not None and end < start):
            raise TierError(f"invalid byte range [{start}, {end}) for {key!r}")
        if end == start:
            check_range(key, self.head(key).size, start, end)
            return None
        options: GetOptions = {}
        if end is not None:
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}
        try:
            result = obstore.get(self._store, key, options=options)
        except OBSTORE_ERRORS as exc:
            if options and not isinstance(exc, FileNotFoundError):
                # Probably 416 (start at or past the end): judge with the real size.
                size = self.head(key).size
                check_range(key, size, start, end)
                if start == size:
                    return None  # an empty read at the very end
            raise self._control.store_error("read", key, exc) from exc
        check_range(key, result.meta["size"], start, end)
        return result

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return bytes ``[start, end)`` of the object (one ranged GET).

        Raises:
            InvalidKeyError: ``key`` is invalid.
            ObjectNotFoundError: no object under ``key``.
            TierError: the range is negative, reversed or runs past the end.
        """
        result = self._open_range(key, start, end)
        if result is None:
            return b""
        try:
            return bytes(result.bytes())
        except OBSTORE_ERRORS as exc:
            raise self._control.store_error("read", key, exc) from exc

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Stream the object's bytes from ``offset`` straight into ``out``, in 4 MiB pieces.

        Raises:
            InvalidKeyError: ``key`` is invalid.
            ObjectNotFoundError: no object under ``key``.
            TierError: the range runs past the end, or the body ended early.
        """
        target = out.cast("B")
        result = self._open_range(key, offset, offset + target.nbytes)
        if result is None:
            return
        pos = 0
        try:
            for chunk in result.stream(min_chunk_size=_READ_CHUNK):
                piece = memoryview(chunk).cast("B")
                if pos + piece.nbytes > target.nbytes:
                    raise TierError(f"the server sent more bytes of {key!r} than asked for")
                target[pos : pos + piece.nbytes] = piece
                pos += piece.nbytes
        except OBSTORE_ERRORS as exc:
            raise self._control.store_error("read", key, exc) from exc
        if pos != target.nbytes:
            raise TierError(
                f"short read of {key!r} in {self.location()}: got {pos} of {target.nbytes} bytes"
            )

    @override
    def head(self, key: str) -> ObjectInfo:
        """Return the object's size, last-modified time and ETag, or raise ObjectNotFoundError."""
        validate_key(key)
        try:
            meta = obstore.head(self._store, key)
        except OBSTORE_ERRORS as exc:
            raise self._control.store_error("head", key, exc) from exc
        return ObjectInfo(
            key, meta["size"], meta["last_modified"].timestamp(), etag(meta.get("e_tag"))
        )

    @override
    def list(self, prefix: str = "") -> Iterator[str]:
        """Return an iterator over the sorted keys starting with ``prefix`` (a snapshot).

        Objects whose names are not valid keys are skipped (see the module docstring).
        """
        return (info.key for info in self.list_info(prefix))

    @override
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Like :meth:`list`, with each object's ``Size`` and ``ETag`` from the same listing.

        One ListObjectsV2 request per 1000 objects, no HEAD per object.
        """
        validate_prefix(prefix)
        found = [info for info in self._control.list_objects(prefix) if is_valid_key(info.key)]
        found.sort(key=lambda info: info.key)
        return iter(found)

    @override
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Return the sorted names ``n`` such that an object lives below ``prefix + n + "/"``.

        Raises:
            InvalidKeyError: ``prefix`` is invalid or neither empty nor ``/``-terminated.
        """
        validate_dir_prefix(prefix)
        names = (common.removesuffix("/") for common in self._control.common_prefixes(prefix))
        return sorted(name for name in names if is_valid_segment(name))

    @override
    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed.

        On a versioned bucket (Object Lock included) this writes a delete marker:
        older versions, held or retained ones among them, stay until deleted by
        version (:meth:`object_versions` lists them).
        """
        self._check_writable("delete", key)
        if not self.exists(key):  # S3's DELETE does not say whether anything was there
            return False
        # botocore's DeleteObject, retried on resets; obstore's bulk delete is not.
        with self._control.errors("delete", key):
            self._control.client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        return True

    @override
    def collect_incomplete(self, prefix: str, older_than_seconds: float) -> int:
        """Abort multipart uploads under ``prefix`` started more than ``older_than_seconds`` ago.

        A writer killed mid-upload leaves its parts stored (and billed) but
        invisible. Younger uploads may belong to a writer still in flight and are
        kept. Returns how many uploads were aborted.
        """
        self._check_writable("abort uploads in", prefix)
        validate_prefix(prefix)
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_seconds)
        return self._control.abort_stale_uploads(prefix, cutoff)

    # --- the control plane (botocore) ------------------------------------------------

    def set_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """Replace the object's S3 tag set with ``tags``."""
        self._check_writable("tag", key)
        self._control.put_tags(validate_key(key), check_tags(tags) or {})

    def get_tags(self, key: str) -> dict[str, str]:
        """The object's S3 tag set."""
        return self._control.get_tags(validate_key(key))

    @override
    def annotate(self, key: str, tags: Mapping[str, str]) -> bool:
        """Merge ``tags`` into the object's S3 tags as ``mouthguard-<tag>``; return True."""
        current = self.get_tags(key)
        current.update({TAG_PREFIX + name: value for name, value in tags.items()})
        self.set_tags(key, current)
        return True

    @override
    def annotations(self, key: str) -> dict[str, str]:
        """The object's ``mouthguard-<tag>`` S3 tags, without the prefix."""
        tags = self.get_tags(key)
        return {k[len(TAG_PREFIX) :]: v for k, v in tags.items() if k.startswith(TAG_PREFIX)}

    @override
    def set_legal_hold(self, key: str, on: bool) -> bool:
        """Place (``on``) or lift the Object Lock legal hold on the object's latest version.

        Returns False, sending nothing, where the bucket has no Object Lock.

        Raises:
            ObjectNotFoundError: no object under ``key``.
        """
        self._check_writable("hold", key)
        validate_key(key)
        if not self._capabilities.object_lock:
            return False
        self._control.put_legal_hold(key, on)
        return True

    def legal_hold(self, key: str) -> bool:
        """Whether a legal hold is on the object's latest version (False without Object Lock)."""
        validate_key(key)
        return self._capabilities.object_lock and self._control.get_legal_hold(key)

    def object_versions(self, key: str) -> builtins.list[str]:
        """Version ids of ``key``, newest first in the server's order ("null" if unversioned)."""
        history = version_history(self._control, validate_key(key))
        return [entry.version_id for entry in history if not entry.delete_marker]
