"""The S3 tier's plumbing: both planes' clients, and the control plane through botocore.

:func:`connect` resolves a tier's settings and opens both planes on the same
endpoint and credentials: the obstore store that carries the bytes, and
:class:`S3Control`, a botocore client for what obstore cannot do (checking the
bucket at open, listing (see :mod:`mouthguard.tiers.s3` for why), tags, legal
holds, aborting abandoned multipart uploads). What the server really does, and
the version arbitration that keeps creates create-only where it ignores
``If-None-Match``, are in :mod:`mouthguard.tiers.s3_probe` (``S3Probe`` is still
importable from here).

Hygiene shared by both planes lives here too: :class:`Credentials` is the only
holder of the secrets (its ``repr`` shows none and :meth:`Credentials.redact`
scrubs them out of any text bound for an error message), and every botocore or
obstore failure becomes a :class:`~mouthguard.errors.TierError` naming the
object and the endpoint. botocore has no type hints: its objects are ``Any``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import botocore.session
import obstore.exceptions
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from obstore.store import S3Store
from typing_extensions import override

from mouthguard.errors import InvalidKeyError, ObjectExistsError, ObjectNotFoundError, TierError
from mouthguard.tiers.object_keys import validate_key

if TYPE_CHECKING:
    from obstore.store import S3Config

    # Moved to s3_probe, which imports this module: re-exported lazily (see __getattr__);
    # the redundant alias marks an explicit re-export for mypy --strict.
    from mouthguard.tiers.s3_probe import S3Probe as S3Probe  # noqa: PLC0414

#: What obstore raises: its own errors, plus builtins for missing objects
#: (``FileNotFoundError``), network trouble (other ``OSError``) and bad arguments.
OBSTORE_ERRORS = (obstore.exceptions.BaseError, OSError, ValueError)
_OBSTORE_EXISTS = (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError)
_OBSTORE_DENIED = (
    obstore.exceptions.PermissionDeniedError,
    obstore.exceptions.UnauthenticatedError,
)
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

    @override
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


def connect(
    url: str,
    *,
    endpoint: str | None,
    region: str | None,
    keys: tuple[str | None, str | None, str | None],
    timeouts: tuple[float, float],
    max_retries: int,
    retry_timeout: float,
    backoff: tuple[float, float],
) -> tuple[S3Control, S3Store]:
    """Both planes of the tier at ``url``, with the bucket checked: (botocore, obstore).

    Settings are those of ``S3Tier`` and default the same way: ``keys`` is (access
    key id, secret access key, session token), each ``None`` taken from ``AWS_*``
    like ``endpoint`` and ``region``; ``timeouts`` is (connect, whole request) and
    ``backoff`` (first, longest), in seconds.

    Raises:
        TierError: a malformed URL or endpoint, half a key pair, a configuration
            obstore refuses, or a missing bucket or dead endpoint (within seconds).
    """
    bucket, prefix = parse_s3_url(url)
    env = os.environ.get
    endpoint = endpoint or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or None
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise TierError(f"S3 endpoint must start with http:// or https://, got {endpoint!r}")
    region = region or env("AWS_REGION") or env("AWS_DEFAULT_REGION") or "us-east-1"
    access, secret, token = keys
    creds = Credentials(
        access if access is not None else env("AWS_ACCESS_KEY_ID"),
        secret if secret is not None else env("AWS_SECRET_ACCESS_KEY"),
        token if token is not None else env("AWS_SESSION_TOKEN"),
    )
    control = S3Control(
        bucket=bucket,
        prefix=prefix,
        endpoint=endpoint,
        region=region,
        credentials=creds,
        connect_timeout=timeouts[0],
        read_timeout=timeouts[1],
        max_attempts=max_retries + 1,
    )
    config: S3Config = {"region": region}
    if endpoint is not None:
        config["endpoint"] = endpoint
    if creds.access_key_id is not None and creds.secret_access_key is not None:
        config["access_key_id"] = creds.access_key_id
        config["secret_access_key"] = creds.secret_access_key
    if creds.session_token:
        config["session_token"] = creds.session_token
    seconds = dt.timedelta
    try:
        store = S3Store(
            bucket,
            prefix=prefix.rstrip("/") or None,
            config=config,
            client_options={
                "allow_http": endpoint is not None and endpoint.startswith("http://"),
                "connect_timeout": seconds(seconds=timeouts[0]),
                "timeout": seconds(seconds=timeouts[1]),
            },
            retry_config={
                "max_retries": max_retries,
                "retry_timeout": seconds(seconds=retry_timeout),
                "backoff": {
                    "init_backoff": seconds(seconds=backoff[0]),
                    "max_backoff": seconds(seconds=backoff[1]),
                    "base": 2,
                },
            },
        )
    except OBSTORE_ERRORS as exc:
        reason = control.reason(exc)
        raise TierError(f"cannot configure the S3 store for {control.endpoint}: {reason}") from exc
    control.check_bucket()
    return control, store


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

    def reason(self, exc: BaseException) -> str:
        """``exc``'s message, short and without credentials, for an error message or a note."""
        return short_reason(str(exc), self._credentials)

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

    def store_error(self, op: str, key: str, exc: Exception) -> TierError:
        """Translate obstore's ``exc`` from ``op`` (``store``, ``read``, ...) on ``key``."""
        where = f"cannot {op} {key!r} (s3://{self.bucket}/{self.prefix}{key} at {self.endpoint})"
        if isinstance(exc, FileNotFoundError) and op != "store":
            return ObjectNotFoundError(f"{where}: no such object")
        if isinstance(exc, _OBSTORE_EXISTS):
            return ObjectExistsError(f"{where}: it already exists")
        if isinstance(exc, _OBSTORE_DENIED):
            return TierError(f"{where}: access denied; check the credentials")
        return TierError(f"{where}: {self.reason(exc)}")

    @contextlib.contextmanager
    def errors(self, op: str, key: str) -> Iterator[None]:
        """Translate botocore failures of ``op`` on ``key`` (see :meth:`error`)."""
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

    # --- listing -------------------------------------------------------------------

    def list_keys(self, prefix: str) -> list[str]:
        """Names (under the tier prefix) of all objects starting with ``prefix``, unfiltered."""
        full_prefix, keys = self.prefix + prefix, list[str]()
        with self.errors("list", prefix or "/"):
            pages = self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        return keys

    def common_prefixes(self, prefix: str) -> list[str]:
        """S3's ``CommonPrefixes`` below ``prefix`` (``/``-delimited), relative to it."""
        full_prefix, names = self.prefix + prefix, list[str]()
        with self.errors("list", prefix or "/"):
            pages = self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix, Delimiter="/"):
                names.extend(
                    c["Prefix"][len(full_prefix) :] for c in page.get("CommonPrefixes", [])
                )
        return names

    # --- per object ----------------------------------------------------------------

    def get_tags(self, key: str) -> dict[str, str]:
        """The object's S3 tag set."""
        with self.errors("read the tags of", key):
            response = self.client.get_object_tagging(Bucket=self.bucket, Key=self.prefix + key)
        # Ceph RGW answers an empty body (no TagSet element) for an untagged object.
        return {tag["Key"]: tag["Value"] for tag in response.get("TagSet", [])}

    def put_tags(self, key: str, tags: Mapping[str, str], version_id: str | None = None) -> None:
        """Replace the tag set of the object's ``version_id`` (default: the latest version)."""
        tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
        version = {"VersionId": version_id} if version_id else {}
        with self.errors("tag", key):
            self.client.put_object_tagging(
                Bucket=self.bucket, Key=self.prefix + key, Tagging={"TagSet": tag_set}, **version
            )

    def put_legal_hold(self, key: str, on: bool) -> None:
        """Place (``on``) or lift the legal hold on the object's latest version."""
        hold = {"Status": "ON" if on else "OFF"}
        with self.errors("set the legal hold of", key):
            self.client.put_object_legal_hold(
                Bucket=self.bucket, Key=self.prefix + key, LegalHold=hold
            )

    def get_legal_hold(self, key: str) -> bool:
        """Whether a legal hold is on the object's latest version."""
        with self.errors("read the legal hold of", key):
            try:
                response = self.client.get_object_legal_hold(
                    Bucket=self.bucket, Key=self.prefix + key
                )
            except ClientError as exc:
                if error_code(exc) in _NO_HOLD:
                    return False
                raise
        return bool(response.get("LegalHold", {}).get("Status") == "ON")

    def abort_stale_uploads(self, prefix: str, cutoff: dt.datetime) -> int:
        """Abort multipart uploads under ``prefix`` initiated before ``cutoff``; return how many.

        An upload that vanishes between listing and abort (completed, or aborted
        by another sweeper) is neither counted nor an error.
        """
        full_prefix, aborted = self.prefix + prefix, 0
        with self.errors("abort the stale uploads under", prefix):
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


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """Resolve names that moved to :mod:`mouthguard.tiers.s3_probe` (lazily: it imports us)."""
        if name == "S3Probe":
            from mouthguard.tiers.s3_probe import S3Probe  # noqa: PLC0415 - import cycle

            return S3Probe
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
