"""How S3 failures read: botocore and obstore exceptions as our TierErrors.

Every failure of either plane becomes a :class:`~mouthguard.errors.TierError`
(``ObjectNotFoundError`` for a missing object, ``ObjectExistsError`` for a
refused create) whose message names the operation, the object and the endpoint,
and never a credential: the libraries' own texts are cut to their first line
and passed through the credentials' ``redact`` before they are quoted.

The functions take their context (endpoint, bucket, the credentials to scrub)
as arguments; :class:`~mouthguard.tiers.s3.control.S3Control` supplies its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import obstore.exceptions
from botocore.exceptions import ClientError

from mouthguard.errors import ObjectExistsError, ObjectNotFoundError, TierError

#: What obstore raises: its own errors, plus builtins for missing objects
#: (``FileNotFoundError``), network trouble (other ``OSError``) and bad arguments.
OBSTORE_ERRORS = (obstore.exceptions.BaseError, OSError, ValueError)
_OBSTORE_EXISTS = (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError)
_OBSTORE_DENIED = (
    obstore.exceptions.PermissionDeniedError,
    obstore.exceptions.UnauthenticatedError,
)

_MISSING = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchVersion"})
_DENIED = frozenset({"AccessDenied", "403", "SignatureDoesNotMatch", "InvalidAccessKeyId"})
#: "No such bucket", as the servers spell it (a HEAD has no body, hence the bare 404).
MISSING_BUCKET = frozenset({"404", "NoSuchBucket", "NotFound"})
#: "No legal hold was ever set" is an error, not Status=OFF: AWS and Ceph RGW spell it differently.
NO_HOLD = frozenset({"NoSuchObjectLockConfiguration", "ObjectLockConfigurationNotFoundError"})
_REASON_LIMIT = 300


class Secrets(Protocol):
    """What holds the secrets an error text must not show (``Credentials``)."""

    def redact(self, text: str) -> str:
        """Return ``text`` with every secret replaced."""
        ...


def short_reason(text: str, secrets: Secrets) -> str:
    """The first line of a library's error text, redacted and cut to a readable length."""
    line = text.strip().splitlines()[0] if text.strip() else "no details"
    return secrets.redact(line[:_REASON_LIMIT] + ("..." if len(line) > _REASON_LIMIT else ""))


def error_code(exc: ClientError) -> str:
    """The S3 error code of ``exc`` (``NoSuchKey``, ``AccessDenied``, ...) or its HTTP status."""
    response: Mapping[str, Any] = exc.response
    code = str(response.get("Error", {}).get("Code") or "")
    return code or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", "unknown"))


def client_error(
    what: str, exc: Exception, *, endpoint: str, bucket: str, secrets: Secrets
) -> TierError:
    """Translate a botocore exception about ``what`` (an operation and its object).

    Args:
        what: e.g. ``"tag 'a/b' (s3://bucket/a/b)"``; the message reads "cannot <what> at ...".
        exc: a ``ClientError`` or any other botocore exception.
        endpoint: the printable endpoint.
        bucket: the bucket, named when it is missing.
        secrets: scrubbed out of any quoted library text.
    """
    where = f"cannot {what} at {endpoint}"
    if not isinstance(exc, ClientError):
        return TierError(f"{where}: {short_reason(str(exc), secrets)}")
    code = error_code(exc)
    if code == "NoSuchBucket":
        return TierError(f"{where}: the bucket {bucket!r} does not exist")
    if code in _MISSING:
        return ObjectNotFoundError(f"{where}: no such object")
    if code in _DENIED:
        return TierError(f"{where}: access denied ({code}); check the credentials")
    message = str(exc.response.get("Error", {}).get("Message") or "")
    return TierError(f"{where}: {short_reason(f'{code} {message}', secrets)}")


def store_error(op: str, key: str, exc: Exception, *, location: str, secrets: Secrets) -> TierError:
    """Translate obstore's ``exc`` from ``op`` (``store``, ``read``, ...) on ``key``.

    Args:
        op: the operation, as the message says it.
        key: the tier's key.
        exc: one of :data:`OBSTORE_ERRORS`.
        location: where the object is, e.g. ``"s3://bucket/a/b at http://host:port"``.
        secrets: scrubbed out of any quoted library text.
    """
    where = f"cannot {op} {key!r} ({location})"
    if isinstance(exc, FileNotFoundError) and op != "store":
        return ObjectNotFoundError(f"{where}: no such object")
    if isinstance(exc, _OBSTORE_EXISTS):
        return ObjectExistsError(f"{where}: it already exists")
    if isinstance(exc, _OBSTORE_DENIED):
        return TierError(f"{where}: access denied; check the credentials")
    return TierError(f"{where}: {short_reason(str(exc), secrets)}")
