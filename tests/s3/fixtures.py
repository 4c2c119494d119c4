"""Pytest fixtures for S3 tests: a real S3 server and fresh buckets.

Register with ``pytest_plugins = ["tests.s3.fixtures"]`` (or ``-p tests.s3.fixtures``).

By default the session starts a throwaway Ceph RADOS Gateway on 127.0.0.1
(:mod:`tests.s3.ceph`, ~1 s). To run the same tests against MinIO or AWS, set:

* ``MOUTHGUARD_TEST_S3_ENDPOINT`` (e.g. ``http://127.0.0.1:9000``; ``aws`` for AWS itself),
  ``MOUTHGUARD_TEST_S3_ACCESS_KEY``, ``MOUTHGUARD_TEST_S3_SECRET_KEY`` and optionally
  ``MOUTHGUARD_TEST_S3_REGION``;
* optionally ``MOUTHGUARD_TEST_S3_BUCKET``: an existing bucket; each test then gets a
  fresh unique prefix in it instead of a fresh bucket;
* optionally ``MOUTHGUARD_TEST_S3_LOCK_BUCKET``: the same for Object-Lock tests (an
  existing bucket with Object Lock); without it a fresh Object-Lock bucket is created.

Missing Ceph programs with no endpoint configured is a test *failure* that says
how to install them, never a silent skip.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from mouthguard.tiers.s3 import S3Tier
from tests.s3.ceph import CephCluster, CephStartError, missing_binaries

ENV_ENDPOINT = "MOUTHGUARD_TEST_S3_ENDPOINT"
ENV_ACCESS_KEY = "MOUTHGUARD_TEST_S3_ACCESS_KEY"
ENV_SECRET_KEY = "MOUTHGUARD_TEST_S3_SECRET_KEY"
ENV_REGION = "MOUTHGUARD_TEST_S3_REGION"
ENV_BUCKET = "MOUTHGUARD_TEST_S3_BUCKET"
ENV_LOCK_BUCKET = "MOUTHGUARD_TEST_S3_LOCK_BUCKET"


@dataclass(frozen=True)
class S3Server:
    """A running S3 server and the credentials of a user that may create buckets.

    Attributes:
        endpoint: ``http(s)://host:port``, or ``None`` for AWS itself.
        is_local_ceph: the server is the throwaway Ceph RGW started by this session.
        version: what is known of the server software (for assertion messages).
    """

    endpoint: str | None
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    is_local_ceph: bool = False
    version: str = "unknown"

    def client(self) -> Any:
        """A boto3 S3 client for this server (checksums only where required, like the tier)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                s3={"addressing_style": "path" if self.endpoint else "auto"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"mode": "standard", "total_max_attempts": 3},
            ),
        )

    def tier_options(self) -> dict[str, Any]:
        """Keyword arguments that point an :class:`S3Tier` at this server."""
        return {
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
        }


@dataclass(frozen=True)
class S3Bucket:
    """A bucket (or a unique prefix in a shared bucket) that belongs to one test.

    Attributes:
        name: the bucket name.
        prefix: ``""`` for a fresh bucket, else a unique ``mouthguard-test-<id>/``.
        object_lock: created with (or known to have) Object Lock.
    """

    server: S3Server
    name: str
    prefix: str
    object_lock: bool

    @property
    def url(self) -> str:
        """``s3://name/prefix`` for :class:`S3Tier`."""
        return f"s3://{self.name}/{self.prefix}"

    def tier(self, **overrides: Any) -> S3Tier:
        """Open a new :class:`S3Tier` over this bucket (fast retries unless overridden)."""
        options = {**self.server.tier_options(), "max_retries": 2, **overrides}
        return S3Tier(self.url, **options)


def _server_from_env() -> S3Server | None:
    endpoint = os.environ.get(ENV_ENDPOINT)
    if not endpoint:
        return None
    access, secret = os.environ.get(ENV_ACCESS_KEY), os.environ.get(ENV_SECRET_KEY)
    if not access or not secret:
        pytest.fail(f"{ENV_ENDPOINT} is set, so {ENV_ACCESS_KEY} and {ENV_SECRET_KEY} must be too")
    return S3Server(
        endpoint=None if endpoint == "aws" else endpoint,
        access_key=access,
        secret_key=secret,
        region=os.environ.get(ENV_REGION, "us-east-1"),
    )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The S3 server of this test session: the configured endpoint, else a local Ceph RGW."""
    configured = _server_from_env()
    if configured is not None:
        yield configured
        return
    if missing := missing_binaries():
        pytest.fail(
            f"S3 tests need Ceph (missing: {', '.join(missing)}) or an endpoint in "
            f"{ENV_ENDPOINT}; install Ceph with `make system-deps`",
            pytrace=False,
        )
    cluster = CephCluster()
    try:
        endpoint = cluster.start()
    except CephStartError as exc:
        pytest.fail(f"the local Ceph S3 server did not start:\n{exc}", pytrace=False)
    try:
        yield S3Server(
            endpoint=endpoint.endpoint,
            access_key=endpoint.access_key,
            secret_key=endpoint.secret_key,
            region=endpoint.region,
            is_local_ceph=True,
            version=ceph_version(),
        )
    finally:
        cluster.stop()


def ceph_version() -> str:
    """What ``ceph --version`` says of the installed Ceph ("unknown" when it cannot say)."""
    import subprocess  # noqa: PLC0415 - only needed for the local server

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["ceph", "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return done.stdout.strip() or "unknown"
    return "unknown"


def _fresh_bucket(server: S3Server, *, object_lock: bool, shared: str | None) -> S3Bucket:
    if shared:
        return S3Bucket(server, shared, f"mouthguard-test-{uuid.uuid4().hex[:16]}/", object_lock)
    name = f"mg-test-{uuid.uuid4().hex[:20]}"
    args: dict[str, Any] = {"Bucket": name}
    if server.region != "us-east-1":
        args["CreateBucketConfiguration"] = {"LocationConstraint": server.region}
    if object_lock:
        args["ObjectLockEnabledForBucket"] = True  # turns versioning on as well
    try:
        server.client().create_bucket(**args)
    except ClientError as exc:
        if object_lock:
            pytest.skip(
                f"cannot create an Object-Lock bucket here ({exc}); set {ENV_LOCK_BUCKET} "
                "to an existing one"
            )
        raise
    return S3Bucket(server, name, "", object_lock)


def _cleanup(bucket: S3Bucket) -> None:
    """Best effort: lift holds, delete every version under the prefix, drop a fresh bucket."""
    client = bucket.server.client()
    with contextlib.suppress(ClientError, BotoCoreError):
        paginator = client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=bucket.name, Prefix=bucket.prefix):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                ref = {"Bucket": bucket.name, "Key": entry["Key"], "VersionId": entry["VersionId"]}
                if bucket.object_lock:
                    with contextlib.suppress(ClientError):
                        client.put_object_legal_hold(**ref, LegalHold={"Status": "OFF"})
                with contextlib.suppress(ClientError):
                    client.delete_object(**ref, BypassGovernanceRetention=bucket.object_lock)
        uploads = client.list_multipart_uploads(Bucket=bucket.name, Prefix=bucket.prefix)
        for upload in uploads.get("Uploads", []):
            with contextlib.suppress(ClientError):
                client.abort_multipart_upload(
                    Bucket=bucket.name, Key=upload["Key"], UploadId=upload["UploadId"]
                )
        if not bucket.prefix:
            client.delete_bucket(Bucket=bucket.name)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh plain bucket (or a fresh prefix in ``$MOUTHGUARD_TEST_S3_BUCKET``)."""
    bucket = _fresh_bucket(s3_server, object_lock=False, shared=os.environ.get(ENV_BUCKET))
    yield bucket
    _cleanup(bucket)


@pytest.fixture
def s3_lock_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh bucket with Object Lock (hence versioning) enabled, or a prefix in
    ``$MOUTHGUARD_TEST_S3_LOCK_BUCKET``."""
    bucket = _fresh_bucket(s3_server, object_lock=True, shared=os.environ.get(ENV_LOCK_BUCKET))
    yield bucket
    _cleanup(bucket)
