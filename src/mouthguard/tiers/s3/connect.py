"""Opening an S3 tier: settings resolved, credentials held, both planes' clients made.

:func:`connect` resolves a tier's settings (arguments, else the ``AWS_*``
environment) and opens both planes on the same endpoint and credentials: the
obstore store that carries the bytes, and the control plane
(:class:`~mouthguard.tiers.s3.control.S3Control`, botocore) for what obstore
cannot do. It checks the bucket before returning, so a missing bucket or a dead
endpoint fails within seconds rather than at the first save.

:class:`Credentials` is the only holder of the secrets: its ``repr`` shows none
and :meth:`Credentials.redact` scrubs them out of any text bound for an error
message (:mod:`mouthguard.tiers.s3.errors`). botocore has no type hints: its
objects are ``Any``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from obstore.store import S3Store
from typing_extensions import override

from mouthguard.errors import InvalidKeyError, TierError
from mouthguard.tiers.object_keys import validate_key
from mouthguard.tiers.s3.control import S3Control
from mouthguard.tiers.s3.errors import MISSING_BUCKET, OBSTORE_ERRORS, error_code, short_reason

if TYPE_CHECKING:
    from obstore.store import S3Config

_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,254}")  # AWS is stricter; Ceph is not

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


def display_endpoint(endpoint: str | None, region: str) -> str:
    """A printable endpoint, ``scheme://host:port``, with any ``user:password@`` removed."""
    if endpoint is None:
        return f"AWS S3 ({region})"
    parts = urlsplit(endpoint)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


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


def warm_up() -> None:
    """Load botocore's S3 models into this process's session, without any request.

    Building the first client of a process reads botocore's service and endpoint
    models from disk (about 0.2 s); later clients of the same session reuse them.
    A process that forks many short-lived clients (the fork server of dataset
    workers) calls this once, so each forked child builds its client in
    milliseconds. The throwaway client has placeholder credentials and a loopback
    endpoint, and is never used.
    """
    _make_client(
        "http://127.0.0.1:9",
        "us-east-1",
        Credentials("placeholder", "placeholder", None),
        (1.0, 1.0),
        1,
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
    check: bool = True,
) -> tuple[S3Control, S3Store]:
    """Both planes of the tier at ``url``, with the bucket checked: (botocore, obstore).

    Settings are those of ``S3Tier`` and default the same way: ``keys`` is (access
    key id, secret access key, session token), each ``None`` taken from ``AWS_*``
    like ``endpoint`` and ``region``; ``timeouts`` is (connect, whole request) and
    ``backoff`` (first, longest), in seconds. The control plane retries each
    request ``max_retries`` times with botocore's ``standard`` backoff.
    ``check=False`` skips the bucket check (and the short-timeout client made for
    it): for a process reopening a tier another one opened and checked moments
    ago (a DataLoader worker), where a missing bucket then fails the first
    request instead.

    Raises:
        TierError: a malformed URL or endpoint, half a key pair, a configuration
            either library refuses, or a missing bucket or dead endpoint (within
            seconds; with ``check``).
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
    shown = display_endpoint(endpoint, region)
    opening = (min(timeouts[0], _OPEN_CONNECT_TIMEOUT), min(timeouts[1], _OPEN_READ_TIMEOUT))
    try:
        client = _make_client(endpoint, region, creds, timeouts, max_retries + 1)
        opener = _make_client(endpoint, region, creds, opening, _OPEN_ATTEMPTS) if check else None
    except (BotoCoreError, ValueError) as exc:
        reason = short_reason(str(exc), creds)
        raise TierError(f"cannot configure the S3 client for {shown}: {reason}") from exc
    control = S3Control(bucket=bucket, prefix=prefix, endpoint=shown, secrets=creds, client=client)
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
    if opener is not None:
        _check_bucket(opener, control)
    return control, store


def _check_bucket(opener: Any, control: S3Control) -> None:
    """Raise a clear TierError, within seconds, unless the bucket exists and is ours to use.

    ``opener`` is a client with short timeouts and two tries, made for this one call.
    """
    try:
        opener.head_bucket(Bucket=control.bucket)
    except ClientError as exc:
        if error_code(exc) in MISSING_BUCKET:
            message = f"S3 bucket {control.bucket!r} does not exist at {control.endpoint}"
            raise TierError(message) from exc
        raise control.error(f"open bucket {control.bucket!r}", exc) from exc
    except BotoCoreError as exc:
        reason = control.reason(exc)
        raise TierError(f"cannot reach the S3 endpoint {control.endpoint}: {reason}") from exc
