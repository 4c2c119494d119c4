"""The S3 tier's control plane: what obstore cannot do, through botocore.

obstore carries the bytes; everything else goes through a botocore client built
with the same endpoint and credentials (:class:`S3Control`): checking the bucket
at open, reading its versioning and Object Lock configuration, measuring
whether it honours conditional puts (:class:`S3Probe`), listing (see
:mod:`mouthguard.tiers.s3` for why), object tags, legal holds, object versions
and aborting abandoned multipart uploads.

Hygiene shared by both planes lives here too: :class:`Credentials` is the only
holder of the secrets (its ``repr`` shows none and :meth:`Credentials.redact`
scrubs them out of any text bound for an error message), and every botocore
failure becomes a :class:`~mouthguard.errors.TierError` naming the object and
the endpoint. botocore has no type hints, so its objects are ``Any`` here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import botocore.session
import obstore
import obstore.exceptions
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from obstore.store import S3Store

from mouthguard.errors import InvalidKeyError, ObjectNotFoundError, TierError
from mouthguard.tiers.keys import validate_key

#: What obstore raises: its own errors, plus builtins for missing objects
#: (``FileNotFoundError``), network trouble (other ``OSError``) and bad arguments.
OBSTORE_ERRORS = (obstore.exceptions.BaseError, OSError, ValueError)
#: Where probe objects go, under the tier's prefix: dot-named, so never a valid
#: key (no caller can collide with it) and never listed.
PROBE_DIR = ".mouthguard-probe"
MAX_TAGS = 10  # S3's limit per object

_MISSING = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchVersion"})
_DENIED = frozenset({"AccessDenied", "403", "SignatureDoesNotMatch", "InvalidAccessKeyId"})
# "No legal hold was ever set" is an error, not Status=OFF: AWS and Ceph RGW spell it differently.
_NO_HOLD = frozenset({"NoSuchObjectLockConfiguration", "ObjectLockConfigurationNotFoundError"})
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,254}")  # AWS is stricter; Ceph is not
_REASON_LIMIT = 300
# The first call at open must fail fast on a dead endpoint: two tries, short waits.
_OPEN_ATTEMPTS, _OPEN_CONNECT_TIMEOUT, _OPEN_READ_TIMEOUT = 2, 5.0, 10.0

# A botocore session loads the service models (~50 ms); clients made from one
# shared session cost ~3 ms. Session.create_client is not thread-safe.
_session_lock = threading.Lock()
_session: Any = None


class Credentials:
    """S3 credentials that never show up in a repr or an error message.

    Both ``None``: the SDKs' default credential chains decide (instance profile, ...).
    """

    __slots__ = ("access_key_id", "secret_access_key", "session_token")

    def __init__(
        self, access_key_id: str | None, secret_access_key: str | None, session_token: str | None
    ) -> None:
        if (access_key_id is None) != (secret_access_key is None):
            raise TierError("S3 credentials need both an access key id and a secret access key")
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key
        self.session_token = session_token

    def redact(self, text: str) -> str:
        """Return ``text`` with every credential replaced by ``***``."""
        for secret in (self.secret_access_key, self.session_token, self.access_key_id):
            if secret:
                text = text.replace(secret, "***")
        return text

    def __repr__(self) -> str:
        return "Credentials(***)"


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket/some/prefix`` into ``("bucket", "some/prefix/")`` (prefix may be "").

    Raises:
        TierError: not ``s3://``, a bad bucket name, or a prefix that is not a valid
            key. User information is refused and never echoed: it may be a secret.
    """
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise TierError("invalid S3 URL: credentials do not belong in the URL")
    if parts.scheme != "s3" or parts.query or parts.fragment or not parts.netloc:
        raise TierError(f"invalid S3 URL {url!r}: expected s3://bucket or s3://bucket/prefix")
    if not _BUCKET.fullmatch(parts.netloc):
        raise TierError(f"invalid S3 bucket name {parts.netloc!r} in {url!r}")
    prefix = parts.path.strip("/")
    if prefix:
        try:
            validate_key(prefix)
        except InvalidKeyError as exc:
            raise TierError(f"invalid prefix in S3 URL {url!r}: {exc}") from None
        prefix += "/"
    return parts.netloc, prefix


def check_tags(tags: Mapping[str, str] | None) -> dict[str, str] | None:
    """Return ``tags`` as a new dict (``None`` if empty).

    Raises:
        TypeError: a tag name or value is not a string.
        TierError: more than S3's 10 tags per object.
    """
    if not tags:
        return None
    result = dict(tags)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in result.items()):
        raise TypeError("S3 object tags must map strings to strings")
    if len(result) > MAX_TAGS:
        raise TierError(f"S3 allows at most {MAX_TAGS} tags per object, got {len(result)}")
    return result


def display_endpoint(endpoint: str | None, region: str) -> str:
    """A printable endpoint, ``scheme://host:port``, with any ``user:password@`` removed."""
    if endpoint is None:
        return f"AWS S3 ({region})"
    parts = urlsplit(endpoint)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


def short_reason(text: str, credentials: Credentials) -> str:
    """The first line of a library's error text, redacted and cut to a readable length."""
    line = text.strip().splitlines()[0] if text.strip() else "no details"
    return credentials.redact(line[:_REASON_LIMIT] + ("..." if len(line) > _REASON_LIMIT else ""))


def error_code(exc: ClientError) -> str:
    """The S3 error code of ``exc`` (``NoSuchKey``, ``AccessDenied``, ...) or its HTTP status."""
    response: Mapping[str, Any] = exc.response
    code = str(response.get("Error", {}).get("Code") or "")
    return code or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", "unknown"))


def _make_client(
    endpoint: str | None,
    region: str,
    credentials: Credentials,
    timeouts: tuple[float, float],
    attempts: int,
) -> Any:
    """A botocore S3 client: (connect, read) ``timeouts`` in seconds, ``attempts`` tries.

    Retries use botocore's ``standard`` mode: exponential backoff with jitter on
    throttling, 5xx and connection errors. Checksums are sent only where the API
    demands them: since 1.36 botocore adds CRC32 checksum headers by default,
    which several S3-compatible servers reject (boto/boto3#4392). Custom
    endpoints get path-style addressing (no wildcard DNS for buckets there).
    """
    global _session  # noqa: PLW0603 - one lazily built session per process, see above
    options = Config(
        region_name=region,
        connect_timeout=timeouts[0],
        read_timeout=timeouts[1],
        retries={"mode": "standard", "total_max_attempts": attempts},
        s3={"addressing_style": "path" if endpoint else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    with _session_lock:
        if _session is None:
            _session = botocore.session.get_session()
        return _session.create_client(
            "s3",
            region_name=region,
            endpoint_url=endpoint,
            aws_access_key_id=credentials.access_key_id,
            aws_secret_access_key=credentials.secret_access_key,
            aws_session_token=credentials.session_token,
            config=options,
        )


@dataclass(frozen=True)
class S3Probe:
    """What the S3 server behind a tier really does, measured when the tier opened.

    Attributes:
        endpoint: the printable endpoint (no credentials).
        bucket: the bucket probed.
        conditional_put: a second create-only put (``If-None-Match: *``) of the
            probe key was refused, so ``PutMode.CREATE`` is atomic on this bucket.
        object_lock: Object Lock is enabled (legal holds are available).
        versioning: ``"Enabled"``, ``"Suspended"``, ``"Off"`` or ``"unknown"``.
        default_retention: the bucket's default Object Lock retention, if any.
        notes: human-readable findings, one sentence each, for ``mouthguard doctor``.
        seconds: how long the probe took.
    """

    endpoint: str
    bucket: str
    conditional_put: bool
    object_lock: bool
    versioning: str
    default_retention: str | None
    notes: tuple[str, ...]
    seconds: float

    def lines(self) -> list[str]:
        """A short human-readable report: one fact per line, then the notes."""
        retention = (
            f", default retention {self.default_retention}" if self.default_retention else ""
        )
        yes = {True: "yes", False: "no"}
        return [
            f"endpoint: {self.endpoint}, bucket: {self.bucket}",
            f"conditional put (If-None-Match: *) honoured: {yes[self.conditional_put]}",
            f"object lock: {yes[self.object_lock]}{retention}",
            f"versioning: {self.versioning}",
            *(f"note: {note}" for note in self.notes),
            f"probe took {self.seconds:.2f} s",
        ]


class S3Control:
    """The control plane of one tier: a botocore client bound to a bucket and key prefix.

    Methods take the tier's keys (already validated) and add the prefix; every
    botocore failure becomes a TierError (``ObjectNotFoundError`` for a missing
    object) naming the key, the bucket and the endpoint.

    Args:
        bucket: the bucket name.
        prefix: the tier's prefix in the bucket, ``""`` or ending with ``/``.
        endpoint: the endpoint URL, or ``None`` for AWS.
        region: the region.
        credentials: the credentials.
        connect_timeout: seconds to connect.
        read_timeout: seconds to wait for a response.
        max_attempts: tries per request, with botocore's ``standard`` backoff
            (exponential with jitter, on throttling, 5xx and connection errors).
    """

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str,
        endpoint: str | None,
        region: str,
        credentials: Credentials,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
    ) -> None:
        self.bucket, self.prefix = bucket, prefix
        self.endpoint = display_endpoint(endpoint, region)
        self._credentials = credentials
        opening = (
            min(connect_timeout, _OPEN_CONNECT_TIMEOUT),
            min(read_timeout, _OPEN_READ_TIMEOUT),
        )
        try:
            self.client = _make_client(
                endpoint, region, credentials, (connect_timeout, read_timeout), max_attempts
            )
            self._opener = _make_client(endpoint, region, credentials, opening, _OPEN_ATTEMPTS)
        except (BotoCoreError, ValueError) as exc:
            reason = short_reason(str(exc), credentials)
            raise TierError(
                f"cannot configure the S3 client for {self.endpoint}: {reason}"
            ) from exc

    def error(self, what: str, exc: Exception) -> TierError:
        """Translate a botocore exception about ``what`` (an operation and its object)."""
        where = f"cannot {what} at {self.endpoint}"
        if not isinstance(exc, ClientError):
            return TierError(f"{where}: {short_reason(str(exc), self._credentials)}")
        code = error_code(exc)
        if code == "NoSuchBucket":
            return TierError(f"{where}: the bucket {self.bucket!r} does not exist")
        if code in _MISSING:
            return ObjectNotFoundError(f"{where}: no such object")
        if code in _DENIED:
            return TierError(f"{where}: access denied ({code}); check the credentials")
        message = str(exc.response.get("Error", {}).get("Message") or "")
        return TierError(f"{where}: {short_reason(f'{code} {message}', self._credentials)}")

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            what = f"{op} {key!r} (s3://{self.bucket}/{self.prefix}{key})"
            raise self.error(what, exc) from exc

    # --- at open -------------------------------------------------------------------

    def check_bucket(self) -> None:
        """Raise a clear TierError, within seconds, unless the bucket exists and is ours to use."""
        try:
            self._opener.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if error_code(exc) in {"404", "NoSuchBucket", "NotFound"}:
                message = f"S3 bucket {self.bucket!r} does not exist at {self.endpoint}"
                raise TierError(message) from exc
            raise self.error(f"open bucket {self.bucket!r}", exc) from exc
        except BotoCoreError as exc:
            reason = short_reason(str(exc), self._credentials)
            raise TierError(f"cannot reach the S3 endpoint {self.endpoint}: {reason}") from exc

    def probe(self, store: S3Store) -> S3Probe:
        """Measure what the bucket does: versioning, Object Lock, and real conditional puts.

        A create-only put of a fresh probe key is sent twice through ``store``
        (the tier's own data plane); conditional put counts as honoured only if
        the second is refused. Ceph RGW, for one, ignores ``If-None-Match`` on
        versioned and Object-Lock buckets, so this is measured on every open. The
        probe object, every version of it, is deleted again (bypassing a default
        GOVERNANCE retention); anything left is reported in the notes. Under a
        default COMPLIANCE retention nothing is written, since no one could delete
        it for the retention period: conditional put then counts as not honoured.
        """
        started = time.monotonic()
        notes: list[str] = []
        versioning = self._versioning(notes)
        object_lock, retention = self._object_lock(notes)
        name = f"{PROBE_DIR}/{uuid.uuid4().hex}"
        conditional, wrote = False, False
        if (retention or "").startswith("COMPLIANCE"):
            notes.append(
                "conditional put not measured: probe objects would be undeletable under the "
                "default COMPLIANCE retention; PutMode.CREATE uses a non-atomic existence check"
            )
        else:
            conditional, wrote = self._measure_create(store, name, versioning, notes)
        if wrote:
            try:
                if versioning == "Off":
                    obstore.delete(store, name)
                else:
                    self._delete_versions(self.prefix + name, (retention or "").startswith("GOV"))
            except (*OBSTORE_ERRORS, ClientError, BotoCoreError) as exc:
                reason = short_reason(str(exc), self._credentials)
                notes.append(f"probe object {self.prefix + name!r} not removed ({reason})")
        return S3Probe(
            endpoint=self.endpoint,
            bucket=self.bucket,
            conditional_put=conditional,
            object_lock=object_lock,
            versioning=versioning,
            default_retention=retention,
            notes=tuple(notes),
            seconds=time.monotonic() - started,
        )

    def _versioning(self, notes: list[str]) -> str:
        try:
            return str(self.client.get_bucket_versioning(Bucket=self.bucket).get("Status") or "Off")
        except (ClientError, BotoCoreError) as exc:
            notes.append(f"versioning unreadable ({short_reason(str(exc), self._credentials)})")
            return "unknown"

    def _object_lock(self, notes: list[str]) -> tuple[bool, str | None]:
        try:
            response = self.client.get_object_lock_configuration(Bucket=self.bucket)
        except ClientError as exc:
            if error_code(exc) not in {"ObjectLockConfigurationNotFoundError", "404"}:
                notes.append(f"Object Lock unreadable ({error_code(exc)}): treated as off")
            return False, None
        except BotoCoreError as exc:
            notes.append(f"Object Lock unreadable ({short_reason(str(exc), self._credentials)})")
            return False, None
        config = response.get("ObjectLockConfiguration", {})
        rule = config.get("Rule", {}).get("DefaultRetention")
        retention = None
        if rule:
            unit = "DAYS" if "Days" in rule else "YEARS"
            retention = f"{rule.get('Mode', '?')} {rule.get('Days') or rule.get('Years')} {unit}"
        return config.get("ObjectLockEnabled") == "Enabled", retention

    def _measure_create(
        self, store: S3Store, name: str, versioning: str, notes: list[str]
    ) -> tuple[bool, bool]:
        """Return (honoured, wrote): whether If-None-Match was enforced; whether we wrote."""
        try:
            obstore.put(store, name, b"mouthguard probe 1", mode="create", use_multipart=False)
        except OBSTORE_ERRORS as exc:
            reason = short_reason(str(exc), self._credentials)
            notes.append(f"probe write failed ({reason}): conditional put treated as not honoured")
            return False, False
        try:
            obstore.put(store, name, b"mouthguard probe 2", mode="create", use_multipart=False)
        except (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
            notes.append("a second create-only put of the probe key was refused: CREATE is atomic")
            return True, True
        except OBSTORE_ERRORS as exc:
            reason = short_reason(str(exc), self._credentials)
            notes.append(f"second probe write failed ({reason}): conditional put not honoured")
            return False, True
        notes.append(
            "the server IGNORED If-None-Match: a second create-only put of the probe key "
            f"succeeded (versioning: {versioning}); PutMode.CREATE falls back to a "
            "non-atomic existence check before the put"
        )
        return False, True

    def _delete_versions(self, full_key: str, bypass_governance: bool) -> None:
        response = self.client.list_object_versions(Bucket=self.bucket, Prefix=full_key)
        extra = {"BypassGovernanceRetention": True} if bypass_governance else {}
        for entry in [*response.get("Versions", []), *response.get("DeleteMarkers", [])]:
            if entry["Key"] == full_key:
                self.client.delete_object(
                    Bucket=self.bucket, Key=full_key, VersionId=entry["VersionId"], **extra
                )

    # --- listing -------------------------------------------------------------------

    def list_keys(self, prefix: str) -> list[str]:
        """Names (under the tier prefix) of all objects starting with ``prefix``, unfiltered."""
        full_prefix, keys = self.prefix + prefix, list[str]()
        with self._errors("list", prefix or "/"):
            pages = self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        return keys

    def common_prefixes(self, prefix: str) -> list[str]:
        """S3's ``CommonPrefixes`` below ``prefix`` (``/``-delimited), relative to it."""
        full_prefix, names = self.prefix + prefix, list[str]()
        with self._errors("list", prefix or "/"):
            pages = self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix, Delimiter="/"):
                names.extend(
                    c["Prefix"][len(full_prefix) :] for c in page.get("CommonPrefixes", [])
                )
        return names

    # --- per object ----------------------------------------------------------------

    def get_tags(self, key: str) -> dict[str, str]:
        """The object's S3 tag set."""
        with self._errors("read the tags of", key):
            response = self.client.get_object_tagging(Bucket=self.bucket, Key=self.prefix + key)
        # Ceph RGW answers an empty body (no TagSet element) for an untagged object.
        return {tag["Key"]: tag["Value"] for tag in response.get("TagSet", [])}

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """Replace the object's S3 tag set."""
        tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
        with self._errors("tag", key):
            self.client.put_object_tagging(
                Bucket=self.bucket, Key=self.prefix + key, Tagging={"TagSet": tag_set}
            )

    def put_legal_hold(self, key: str, on: bool) -> None:
        """Place (``on``) or lift the legal hold on the object's latest version."""
        hold = {"Status": "ON" if on else "OFF"}
        with self._errors("set the legal hold of", key):
            self.client.put_object_legal_hold(
                Bucket=self.bucket, Key=self.prefix + key, LegalHold=hold
            )

    def get_legal_hold(self, key: str) -> bool:
        """Whether a legal hold is on the object's latest version."""
        with self._errors("read the legal hold of", key):
            try:
                response = self.client.get_object_legal_hold(
                    Bucket=self.bucket, Key=self.prefix + key
                )
            except ClientError as exc:
                if error_code(exc) in _NO_HOLD:
                    return False
                raise
        return bool(response.get("LegalHold", {}).get("Status") == "ON")

    def versions(self, key: str) -> list[str]:
        """Version ids of exactly ``key``, newest first (delete markers excluded)."""
        full_key = self.prefix + key
        found: list[tuple[dt.datetime, str]] = []
        with self._errors("list the versions of", key):
            pages = self.client.get_paginator("list_object_versions")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_key):
                found.extend(
                    (v["LastModified"], v["VersionId"])
                    for v in page.get("Versions", [])
                    if v["Key"] == full_key
                )
        # S3 lists newest first already; the stable sort keeps that order on ties.
        found.sort(key=lambda item: item[0], reverse=True)
        return [version for _, version in found]

    def abort_stale_uploads(self, prefix: str, cutoff: dt.datetime) -> int:
        """Abort multipart uploads under ``prefix`` initiated before ``cutoff``; return how many.

        An upload that vanishes between listing and abort (completed, or aborted
        by another sweeper) is neither counted nor an error.
        """
        full_prefix, aborted = self.prefix + prefix, 0
        with self._errors("abort the stale uploads under", prefix):
            pages = self.client.get_paginator("list_multipart_uploads")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for upload in page.get("Uploads", []):
                    if not upload["Key"].startswith(full_prefix) or upload["Initiated"] > cutoff:
                        continue
                    try:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except ClientError as exc:
                        if error_code(exc) not in {"NoSuchUpload", "404"}:
                            raise
                        continue
                    aborted += 1
        return aborted
