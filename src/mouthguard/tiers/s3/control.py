"""The S3 tier's control plane: what obstore cannot do, through botocore.

:class:`S3Control` is a botocore client bound to one bucket and key prefix. It
lists (see :mod:`mouthguard.tiers.s3` for why listing does not go through
obstore), reads and writes object tags and Object Lock legal holds, and aborts
abandoned multipart uploads. Every failure becomes a
:class:`~mouthguard.errors.TierError` naming the object, the bucket and the
endpoint (:mod:`mouthguard.tiers.s3.errors`), never a credential.

It is made by :func:`mouthguard.tiers.s3.connect.connect`; object versions are
in :mod:`mouthguard.tiers.s3.versions`. botocore has no type hints: its objects
are ``Any``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from mouthguard.errors import TierError
from mouthguard.tiers.base import ObjectInfo
from mouthguard.tiers.s3.errors import (
    NO_HOLD,
    Secrets,
    client_error,
    error_code,
    short_reason,
    store_error,
)

MAX_TAGS = 10  # S3's limit per object


def etag(raw: str | None) -> str | None:
    """An S3 ETag as the tier reports it: without the quotes HTTP puts around it.

    ListObjectsV2 and HEAD both quote it; stripping them in one place makes the
    listing's and ``head``'s stamps of one object compare equal.
    """
    return raw.strip('"') if raw else None


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


class S3Control:
    """The control plane of one tier: a botocore client bound to a bucket and key prefix.

    Methods take the tier's keys (already validated) and add the prefix; every
    botocore failure becomes a TierError (``ObjectNotFoundError`` for a missing
    object) naming the key, the bucket and the endpoint.

    Args:
        bucket: the bucket name.
        prefix: the tier's prefix in the bucket, ``""`` or ending with ``/``.
        endpoint: the printable endpoint (no credentials), for messages.
        secrets: what error messages must not show (the tier's credentials).
        client: the botocore S3 client, with the tier's timeouts and retries.

    Attributes:
        client: the botocore client, for the version calls of ``s3_versions``.
    """

    def __init__(
        self, *, bucket: str, prefix: str, endpoint: str, secrets: Secrets, client: Any
    ) -> None:
        self.bucket, self.prefix = bucket, prefix
        self.endpoint = endpoint
        self.client = client
        self._secrets = secrets

    # --- errors, in this tier's words ------------------------------------------------

    def reason(self, exc: BaseException) -> str:
        """``exc``'s message, short and without credentials, for an error message or a note."""
        return short_reason(str(exc), self._secrets)

    def error(self, what: str, exc: Exception) -> TierError:
        """Translate a botocore exception about ``what`` (an operation and its object)."""
        return client_error(
            what, exc, endpoint=self.endpoint, bucket=self.bucket, secrets=self._secrets
        )

    def store_error(self, op: str, key: str, exc: Exception) -> TierError:
        """Translate obstore's ``exc`` from ``op`` (``store``, ``read``, ...) on ``key``."""
        location = f"s3://{self.bucket}/{self.prefix}{key} at {self.endpoint}"
        return store_error(op, key, exc, location=location, secrets=self._secrets)

    @contextlib.contextmanager
    def errors(self, op: str, key: str) -> Iterator[None]:
        """Translate botocore failures of ``op`` on ``key`` (see :meth:`error`)."""
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            what = f"{op} {key!r} (s3://{self.bucket}/{self.prefix}{key})"
            raise self.error(what, exc) from exc

    # --- listing -------------------------------------------------------------------

    def list_objects(self, prefix: str) -> list[ObjectInfo]:
        """Every object (name under the tier prefix) starting with ``prefix``, unfiltered.

        Each with the ``Size``, ``LastModified`` and ``ETag`` (quotes removed, as
        :func:`etag` gives it) that ListObjectsV2 returns: no request per object.
        """
        full_prefix, found = self.prefix + prefix, list[ObjectInfo]()
        with self.errors("list", prefix or "/"):
            pages = self.client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full_prefix):
                found.extend(
                    ObjectInfo(
                        obj["Key"][len(self.prefix) :],
                        int(obj["Size"]),
                        obj["LastModified"].timestamp() if "LastModified" in obj else None,
                        etag(obj.get("ETag")),
                    )
                    for obj in page.get("Contents", [])
                )
        return found

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
                if error_code(exc) in NO_HOLD:
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
