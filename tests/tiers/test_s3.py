"""S3Tier against a real S3 server: the conformance suite, plus what only S3 has.

The server is the session's ``s3_server`` (a throwaway Ceph RGW on 127.0.0.1
unless ``MOUTHGUARD_TEST_S3_ENDPOINT`` names another). Every test gets a fresh
bucket, so tests never see each other's objects.
"""

from __future__ import annotations

import socket
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from mouthguard.errors import ObjectExistsError, ObjectNotFoundError, TierError
from mouthguard.testing.conformance import MiB, TierConformance, payload
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.s3 import CreateGuard, S3Tier
from mouthguard.tiers.s3 import create as s3_create
from mouthguard.tiers.s3.create import rivals
from mouthguard.tiers.s3.versions import VersionEntry, _merge_page, version_history
from tests.s3.fixtures import S3Bucket, S3Server


class TestS3TierPlainBucket(TierConformance):
    @pytest.fixture
    def make_tier(self, s3_bucket: S3Bucket) -> Callable[[], Tier]:
        return s3_bucket.tier


class TestS3TierObjectLockBucket(TierConformance):
    @pytest.fixture
    def make_tier(self, s3_lock_bucket: S3Bucket) -> Callable[[], Tier]:
        return s3_lock_bucket.tier


# --- what the probe measures -------------------------------------------------------


def key_of(bucket: S3Bucket, key: str) -> str:
    return bucket.prefix + key


def measure_if_none_match(bucket: S3Bucket) -> bool:
    """Ask the server directly (boto3, not obstore) whether it refuses a second create."""
    client = bucket.server.client()
    key = f"{bucket.prefix}measure/if-none-match"
    client.put_object(Bucket=bucket.name, Key=key, Body=b"1", IfNoneMatch="*")
    try:
        client.put_object(Bucket=bucket.name, Key=key, Body=b"2", IfNoneMatch="*")
    except ClientError as exc:
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        return bool(status in (409, 412))
    return False


def no_versions_left(bucket: S3Bucket) -> bool:
    listing = bucket.server.client().list_object_versions(Bucket=bucket.name, Prefix=bucket.prefix)
    return not listing.get("Versions") and not listing.get("DeleteMarkers")


def test_probe_plain_bucket(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier()
    probe = tier.probe
    assert no_versions_left(s3_bucket), "the probe must remove its objects"
    assert probe.conditional_put == measure_if_none_match(s3_bucket)
    assert not probe.object_lock
    assert not tier.capabilities.object_lock
    assert tier.capabilities.conditional_put == probe.create_guard.atomic
    assert tier.capabilities.durable and tier.capabilities.persistent
    assert not tier.capabilities.atomic_rename
    if s3_bucket.server.is_local_ceph and not s3_bucket.prefix:
        # Measured on Ceph RGW 16.2.15 (Debian): a plain bucket honours If-None-Match.
        assert probe.conditional_put, f"{s3_bucket.server.version}: plain bucket, {probe}"
        assert probe.create_guard is CreateGuard.IF_NONE_MATCH
        assert probe.versioning == "Off"
    assert any("conditional put" in line for line in probe.lines())
    assert any(line.startswith("create-only put: ") for line in probe.lines())


def test_probe_object_lock_bucket(s3_lock_bucket: S3Bucket) -> None:
    tier = s3_lock_bucket.tier()
    probe = tier.probe
    assert no_versions_left(s3_lock_bucket), "the probe must remove every version it made"
    assert probe.object_lock and tier.capabilities.object_lock
    assert probe.versioning == "Enabled"
    assert probe.conditional_put == measure_if_none_match(s3_lock_bucket)
    # Versioned: CREATE is atomic either way (the server's If-None-Match, or version order).
    assert tier.capabilities.conditional_put
    if s3_lock_bucket.server.is_local_ceph:
        # Measured on Ceph RGW 16.2.15 (Debian): Object-Lock (versioned) buckets IGNORE
        # If-None-Match, a second create-only put simply adds a version.
        assert not probe.conditional_put, f"{s3_lock_bucket.server.version}: lock bucket, {probe}"
        assert any("IGNORED" in note for note in probe.notes)
        assert probe.create_guard is CreateGuard.OLDEST_VERSION


def test_probe_versioned_bucket(s3_bucket: S3Bucket) -> None:
    if s3_bucket.prefix:
        pytest.skip("would change the versioning of the shared bucket")
    client = s3_bucket.server.client()
    client.put_bucket_versioning(
        Bucket=s3_bucket.name, VersioningConfiguration={"Status": "Enabled"}
    )
    probe = s3_bucket.tier().probe
    assert no_versions_left(s3_bucket), "the probe must remove every version it made"
    assert probe.versioning == "Enabled" and not probe.object_lock
    assert probe.conditional_put == measure_if_none_match(s3_bucket)
    assert probe.create_guard is not CreateGuard.EXISTENCE_CHECK
    if s3_bucket.server.is_local_ceph:
        # Measured on Ceph RGW 16.2.15 (Debian): versioning alone makes RGW ignore If-None-Match.
        assert not probe.conditional_put, f"{s3_bucket.server.version}: versioned bucket, {probe}"
        assert probe.create_guard is CreateGuard.OLDEST_VERSION


def test_probe_suspended_versioning_is_not_arbitrable(s3_bucket: S3Bucket) -> None:
    if s3_bucket.prefix:
        pytest.skip("would change the versioning of the shared bucket")
    client = s3_bucket.server.client()
    for status in ("Enabled", "Suspended"):
        client.put_bucket_versioning(
            Bucket=s3_bucket.name, VersioningConfiguration={"Status": status}
        )
    tier = s3_bucket.tier()
    probe = tier.probe
    assert probe.versioning == "Suspended"
    assert no_versions_left(s3_bucket), "the probe must remove every version it made"
    # Suspended versioning overwrites the "null" version: version order cannot tell
    # creators apart, so only the server's own If-None-Match can make CREATE atomic.
    expected = CreateGuard.IF_NONE_MATCH if probe.conditional_put else CreateGuard.EXISTENCE_CHECK
    assert probe.create_guard is expected
    assert tier.capabilities.conditional_put == probe.conditional_put
    if not probe.conditional_put:
        assert any("NOT atomic" in note for note in probe.notes)


@pytest.mark.parametrize("mode", ["GOVERNANCE", "COMPLIANCE"])
def test_probe_under_default_retention_leaves_nothing(s3_lock_bucket: S3Bucket, mode: str) -> None:
    if s3_lock_bucket.prefix:
        pytest.skip("would change the retention rule of the shared bucket")
    s3_lock_bucket.server.client().put_object_lock_configuration(
        Bucket=s3_lock_bucket.name,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": mode, "Days": 1}},
        },
    )
    probe = s3_lock_bucket.tier().probe
    assert probe.default_retention == f"{mode} 1 DAYS"
    assert no_versions_left(s3_lock_bucket), probe.notes
    assert probe.create_guard is not CreateGuard.EXISTENCE_CHECK
    if mode == "COMPLIANCE":
        assert not probe.conditional_put
        assert any("not measured" in note for note in probe.notes)
        # Nothing may be written to measure it: version order is assumed on a versioned bucket.
        assert probe.create_guard is CreateGuard.OLDEST_VERSION


def test_create_without_conditional_put_still_refuses_sequential_creates(
    s3_lock_bucket: S3Bucket,
) -> None:
    tier = s3_lock_bucket.tier()
    tier.put("m/manifest.json", b"{}", mode=PutMode.CREATE)
    with pytest.raises(ObjectExistsError):
        tier.put("m/manifest.json", b"{1}", mode=PutMode.CREATE)
    assert tier.get("m/manifest.json") == b"{}"
    assert len(tier.object_versions("m/manifest.json")) == 1


# --- multipart -----------------------------------------------------------------------


def etag_parts(bucket: S3Bucket, key: str) -> int:
    """How many parts S3 says the object was uploaded in (1 for a single PUT)."""
    head = bucket.server.client().head_object(Bucket=bucket.name, Key=key_of(bucket, key))
    etag = head["ETag"].strip('"')
    return int(etag.rsplit("-", 1)[1]) if "-" in etag else 1


def test_multipart_roundtrip_is_byte_exact(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier(part_size=8 * MiB)
    data = payload(24 * MiB + 123, seed=24)
    chunks = (memoryview(data)[i : i + 3 * MiB] for i in range(0, len(data), 3 * MiB))
    info = tier.put("mp/blob", chunks, tags={"mouthguard-importance": "milestone"})
    assert info.size == len(data)
    assert tier.head("mp/blob").size == len(data)
    assert etag_parts(s3_bucket, "mp/blob") == 4  # 24 MiB + 123 B in 8 MiB parts
    assert tier.get("mp/blob") == data
    out = bytearray(9 * MiB)
    tier.read_into("mp/blob", 7 * MiB + 5, memoryview(out))
    assert out == data[7 * MiB + 5 : 16 * MiB + 5]
    assert tier.get_tags("mp/blob") == {"mouthguard-importance": "milestone"}
    # One chunk spanning several parts, and one big buffer (sliced, not copied).
    tier.put("mp/big-chunk", [data[:1], memoryview(data)[1 : 17 * MiB]])
    tier.put("mp/one-buffer", memoryview(data)[: 17 * MiB])
    for key in ("mp/big-chunk", "mp/one-buffer"):
        assert tier.get(key) == data[: 17 * MiB]
        assert etag_parts(s3_bucket, key) == 3
    # At most one part: a single PUT.
    tier.put("mp/small", (memoryview(data)[i : i + MiB] for i in range(0, 8 * MiB, MiB)))
    assert etag_parts(s3_bucket, "mp/small") == 1


def test_listing_carries_each_objects_size_and_the_servers_etag(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier(part_size=5 * MiB)
    put = {
        "l/small": tier.put("l/small", b"abc"),
        "l/big": tier.put("l/big", [payload(11 * MiB, seed=4)]),  # multipart: 3 parts
    }
    client = s3_bucket.server.client()
    listed = list(tier.list_info("l/"))
    assert [info.key for info in listed] == ["l/big", "l/small"]
    for info in listed:
        raw = client.head_object(Bucket=s3_bucket.name, Key=key_of(s3_bucket, info.key))
        assert info.size == raw["ContentLength"]
        assert info.etag == raw["ETag"].strip('"')  # the server's ETag, unquoted
        assert tier.head(info.key).etag == info.etag
        # obstore reports the ETag of a single PUT; of a multipart upload, none.
        assert put[info.key].etag in {info.etag, None if info.key == "l/big" else info.etag}
    assert listed[0].etag is not None and listed[0].etag.endswith("-3")


def test_multipart_reused_buffer_and_failing_source(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier(part_size=5 * MiB)
    buf = bytearray(MiB)

    def refill(count: int, fail: bool = False) -> Iterator[bytearray]:
        for i in range(count):
            buf[:] = bytes([i]) * MiB
            yield buf
        if fail:
            raise RuntimeError("source died late")

    tier.put("reused", refill(12))
    assert tier.get("reused") == b"".join(bytes([i]) * MiB for i in range(12))
    with pytest.raises(RuntimeError, match="source died late"):
        tier.put("broken", refill(12, fail=True))
    assert not tier.exists("broken")
    uploads = s3_bucket.server.client().list_multipart_uploads(Bucket=s3_bucket.name)
    assert not uploads.get("Uploads"), "a failed stream must abort its multipart upload"


# --- tags, holds, versions ---------------------------------------------------------


def test_tags_on_put_are_s3_object_tags(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier()
    tier.put("t/obj", b"data", tags={"mouthguard-importance": "critical", "team": "llm"})
    tagging = s3_bucket.server.client().get_object_tagging(
        Bucket=s3_bucket.name, Key=key_of(s3_bucket, "t/obj")
    )
    assert {t["Key"]: t["Value"] for t in tagging["TagSet"]} == {
        "mouthguard-importance": "critical",
        "team": "llm",
    }
    tier.set_tags("t/obj", {"a": "1"})
    assert tier.get_tags("t/obj") == {"a": "1"}
    assert tier.annotate("t/obj", {"importance": "golden"})
    assert tier.get_tags("t/obj") == {"a": "1", "mouthguard-importance": "golden"}
    assert tier.annotations("t/obj") == {"importance": "golden"}
    with pytest.raises(ObjectNotFoundError, match="t/missing"):
        tier.get_tags("t/missing")


def test_legal_hold_on_and_off(s3_lock_bucket: S3Bucket) -> None:
    tier = s3_lock_bucket.tier()
    client = s3_lock_bucket.server.client()
    tier.put("h/golden", b"keep me")
    ref = {"Bucket": s3_lock_bucket.name, "Key": key_of(s3_lock_bucket, "h/golden")}
    assert tier.legal_hold("h/golden") is False
    assert tier.set_legal_hold("h/golden", True) is True
    assert client.get_object_legal_hold(**ref)["LegalHold"]["Status"] == "ON"
    assert tier.legal_hold("h/golden") is True
    assert tier.set_legal_hold("h/golden", False) is True
    assert client.get_object_legal_hold(**ref)["LegalHold"]["Status"] == "OFF"
    assert tier.legal_hold("h/golden") is False
    with pytest.raises(ObjectNotFoundError):
        tier.set_legal_hold("h/missing", True)


def test_legal_hold_needs_object_lock(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier()
    tier.put("h/x", b"x")
    assert tier.set_legal_hold("h/x", True) is False
    assert tier.legal_hold("h/x") is False


def test_object_versions(s3_lock_bucket: S3Bucket) -> None:
    tier = s3_lock_bucket.tier()
    tier.put("v/obj", b"one")
    tier.put("v/obj", b"two")
    tier.put("v/objx", b"other key, same string prefix")
    versions = tier.object_versions("v/obj")
    assert len(versions) == 2
    client = s3_lock_bucket.server.client()
    newest = client.get_object(
        Bucket=s3_lock_bucket.name, Key=key_of(s3_lock_bucket, "v/obj"), VersionId=versions[0]
    )
    assert newest["Body"].read() == b"two"


# --- prefixes, debris ----------------------------------------------------------------


def test_keys_live_under_the_url_prefix(s3_bucket: S3Bucket) -> None:
    tier = S3Tier(f"{s3_bucket.url}deep/er", **s3_bucket.server.tier_options())
    tier.put("a/b", b"x")
    client = s3_bucket.server.client()
    listed = client.list_objects_v2(Bucket=s3_bucket.name, Prefix=s3_bucket.prefix)
    assert [o["Key"] for o in listed["Contents"]] == [f"{s3_bucket.prefix}deep/er/a/b"]
    assert tier.location("a/") == f"s3://{s3_bucket.name}/{s3_bucket.prefix}deep/er/a/"
    assert list(tier.list()) == ["a/b"]
    assert s3_bucket.tier().list_dirs() == ["deep"]


def test_foreign_and_probe_names_are_invisible(s3_bucket: S3Bucket) -> None:
    # A probe left behind by a killed process, or objects another tool wrote with
    # names that are not valid keys, must not show up as objects.
    client = s3_bucket.server.client()
    for name in [".mouthguard-probe/0123", "bad name", "dir/.hidden", "x//y"]:
        client.put_object(Bucket=s3_bucket.name, Key=key_of(s3_bucket, name), Body=b"?")
    tier = s3_bucket.tier()
    tier.put("dir/ok", b"ok")
    assert list(tier.list()) == ["dir/ok"]
    assert list(tier.list("dir/")) == ["dir/ok"]
    assert tier.list_dirs() == ["dir", "x"]  # "x//y" lives below "x/"; its key is invalid


def test_collect_incomplete_aborts_abandoned_uploads(s3_bucket: S3Bucket) -> None:
    tier = s3_bucket.tier()
    client = s3_bucket.server.client()
    upload = client.create_multipart_upload(
        Bucket=s3_bucket.name, Key=key_of(s3_bucket, "run/000001/rank-0")
    )
    client.upload_part(
        Bucket=s3_bucket.name,
        Key=key_of(s3_bucket, "run/000001/rank-0"),
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=b"x" * 1000,
    )
    assert list(tier.list()) == []  # invisible
    assert tier.collect_incomplete("", 3600) == 0  # too young
    assert tier.collect_incomplete("other/", 0) == 0  # elsewhere
    assert tier.collect_incomplete("run/0000", 0) == 1
    assert not client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads")
    assert tier.collect_incomplete("run/", 0) == 0


# --- failures: bounded and clear, never leaking credentials ----------------------------


#: Data-plane retries that would last hours: opening a tier must not use them, so a
#: test using these fails by hanging (the suite's timeout) rather than by a stopwatch.
_PATIENT = {"max_retries": 1000, "retry_timeout": 36_000.0}


def test_missing_bucket_fails_fast(s3_server: S3Server) -> None:
    with pytest.raises(TierError, match="mg-no-such-bucket") as excinfo:
        S3Tier("s3://mg-no-such-bucket/x", **s3_server.tier_options(), **_PATIENT)
    assert "does not exist" in str(excinfo.value)


def test_dead_endpoint_fails_fast(s3_server: S3Server) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nobody listens
    options = {**s3_server.tier_options(), **_PATIENT, "endpoint": f"http://127.0.0.1:{port}"}
    with pytest.raises(TierError, match=f"cannot reach the S3 endpoint http://127.0.0.1:{port}"):
        S3Tier("s3://some-bucket", **options)


def all_text(exc: BaseException | None) -> str:
    """The messages of ``exc`` and of every exception chained to it."""
    texts = []
    while exc is not None:
        texts.append("".join(traceback.format_exception_only(exc)))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def test_no_credentials_in_reprs_or_errors(s3_bucket: S3Bucket) -> None:
    server = s3_bucket.server
    tier = s3_bucket.tier()
    secrets = [server.secret_key, server.access_key]
    texts = [repr(tier), str(tier), repr(tier.probe), "\n".join(tier.probe.lines())]
    with pytest.raises(ObjectNotFoundError) as missing:
        tier.get("no/such/key")
    texts.append(all_text(missing.value))
    assert "no/such/key" in str(missing.value)
    assert (server.endpoint or "AWS") in str(missing.value)
    wrong = {**server.tier_options(), "secret_access_key": "wrong-secret-6f1d2c"}
    with pytest.raises(TierError, match="access denied") as denied:
        S3Tier(s3_bucket.url, **wrong)
    texts.append(all_text(denied.value))
    secrets.append("wrong-secret-6f1d2c")
    with pytest.raises(TierError) as in_url:
        S3Tier("s3://key:hunter2@bucket/x", **server.tier_options())
    texts.append(all_text(in_url.value))
    secrets.append("hunter2")
    for text in texts:
        for secret in secrets:
            assert secret not in text


def test_credentials_default_to_the_aws_environment(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = s3_bucket.server
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_REGION", server.region)
    if server.endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    tier = S3Tier(s3_bucket.url, max_retries=1)
    tier.put("env", b"ok")
    assert tier.get("env") == b"ok"


@pytest.mark.parametrize(
    "url", ["http://bucket/x", "s3://", "s3://b/../x", "s3://bucket/a//b", "s3://bucket?x=1"]
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(TierError):
        S3Tier(url, endpoint="http://127.0.0.1:1", access_key_id="a", secret_access_key="b")


# --- create-only puts where the server ignores If-None-Match: version arbitration ---------

RACE_TIMEOUT = 60.0  # seconds: bounds every barrier wait and thread join below


def race(
    tiers: list[S3Tier], key: str, bodies: list[bytes], *, force: bool
) -> list[BaseException | None]:
    """``put(CREATE)`` of ``bodies[i]`` through ``tiers[i]``, all at once; each one's outcome.

    With ``force``, every writer's existence check passes before any writer PUTs,
    so all of them reach the server and the version arbitration decides.
    """
    start = threading.Barrier(len(tiers), timeout=RACE_TIMEOUT)
    checked = threading.Barrier(len(tiers), timeout=RACE_TIMEOUT)
    outcomes: list[BaseException | None] = [None] * len(tiers)
    for tier in tiers:
        if force:
            tier.exists = racing_exists(tier.exists, checked)  # type: ignore[method-assign]

    def writer(i: int) -> None:
        start.wait()
        try:
            tiers[i].put(key, bodies[i], mode=PutMode.CREATE)
        except Exception as exc:  # the outcome is what the test asserts
            outcomes[i] = exc

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(tiers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RACE_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    return outcomes


def racing_exists(
    exists: Callable[[str], bool], barrier: threading.Barrier
) -> Callable[[str], bool]:
    """``exists`` that answers, then waits until every racer has its answer."""

    def check(key: str) -> bool:
        found = exists(key)
        barrier.wait()
        return found

    return check


def latest_version(bucket: S3Bucket, key: str) -> str:
    head = bucket.server.client().head_object(Bucket=bucket.name, Key=key_of(bucket, key))
    return str(head["VersionId"])


@pytest.mark.parametrize("force", [True, False], ids=["all-past-head", "natural"])
@pytest.mark.parametrize("size", [64 * 1024, 6 * MiB], ids=["single-put", "multipart"])
def test_racing_creates_on_a_versioned_bucket_have_one_winner(
    s3_lock_bucket: S3Bucket, force: bool, size: int
) -> None:
    writers = 6
    # One tier each, as separate processes would have: own clients, own connections.
    tiers = [s3_lock_bucket.tier(part_size=5 * MiB) for _ in range(writers)]
    assert tiers[0].probe.create_guard is not CreateGuard.EXISTENCE_CHECK
    bodies = [payload(size, seed=i) for i in range(writers)]
    outcomes = race(tiers, "run/000000000001/rank-00000.safetensors", bodies, force=force)
    winners = [i for i, outcome in enumerate(outcomes) if outcome is None]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, ObjectExistsError) for o in outcomes if o is not None), outcomes
    key = "run/000000000001/rank-00000.safetensors"
    assert tiers[1].get(key) == bodies[winners[0]]
    # Every loser removed its own version: the winner's is the only one left.
    assert tiers[1].object_versions(key) == [latest_version(s3_lock_bucket, key)]
    if force and tiers[0].probe.create_guard is CreateGuard.OLDEST_VERSION:
        lost = [str(o) for o in outcomes if o is not None]
        assert all("ours was removed" in message for message in lost)


def test_a_create_that_lost_removes_its_version(s3_lock_bucket: S3Bucket) -> None:
    first, second = s3_lock_bucket.tier(), s3_lock_bucket.tier()
    if first.probe.create_guard is not CreateGuard.OLDEST_VERSION:
        pytest.skip("the server enforces If-None-Match on this bucket")
    first.put("k", b"first", mode=PutMode.CREATE)
    second.exists = lambda key: False  # type: ignore[method-assign] # its HEAD came too early
    with pytest.raises(ObjectExistsError, match="concurrent create"):
        second.put("k", b"second", mode=PutMode.CREATE)
    assert first.get("k") == b"first"
    assert len(first.object_versions("k")) == 1


def test_a_lost_create_that_cannot_be_deleted_is_covered(
    s3_lock_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a default COMPLIANCE retention does to the loser's version: it stays.
    first, second = s3_lock_bucket.tier(), s3_lock_bucket.tier()
    if first.probe.create_guard is not CreateGuard.OLDEST_VERSION:
        pytest.skip("the server enforces If-None-Match on this bucket")
    first.put("k", b"first", mode=PutMode.CREATE, tags={"mouthguard-importance": "critical"})

    def refuse(*_: object, **__: object) -> None:
        raise TierError("AccessDenied (simulated retention)")

    monkeypatch.setattr(s3_create, "delete_version", refuse)
    second.exists = lambda key: False  # type: ignore[method-assign]
    with pytest.raises(ObjectExistsError, match="covers ours"):
        second.put("k", b"second", mode=PutMode.CREATE)
    # Readers of the latest version see the winner's bytes (and tags) again.
    assert first.get("k") == b"first"
    assert first.get_tags("k") == {"mouthguard-importance": "critical"}
    assert len(first.object_versions("k")) == 3  # winner, loser, the winner's copy on top


@pytest.mark.parametrize("mode", ["GOVERNANCE", "COMPLIANCE"])
def test_a_lost_create_under_default_retention(s3_lock_bucket: S3Bucket, mode: str) -> None:
    if s3_lock_bucket.prefix:
        pytest.skip("would change the retention rule of the shared bucket")
    if mode == "COMPLIANCE" and not s3_lock_bucket.server.is_local_ceph:
        pytest.skip("would leave undeletable objects for a day on a real server")
    s3_lock_bucket.server.client().put_object_lock_configuration(
        Bucket=s3_lock_bucket.name,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": mode, "Days": 1}},
        },
    )
    first, second = s3_lock_bucket.tier(), s3_lock_bucket.tier()
    if first.probe.create_guard is not CreateGuard.OLDEST_VERSION:
        pytest.skip("the server enforces If-None-Match on this bucket")
    first.put("k", b"first", mode=PutMode.CREATE)
    second.exists = lambda key: False  # type: ignore[method-assign]
    # GOVERNANCE: the loser bypasses it to delete its version; COMPLIANCE: nobody can,
    # so the loser covers its version with a copy of the winner's.
    expected = "ours was removed" if mode == "GOVERNANCE" else "covers ours"
    with pytest.raises(ObjectExistsError, match=expected):
        second.put("k", b"second", mode=PutMode.CREATE)
    assert first.get("k") == b"first"
    assert len(first.object_versions("k")) == (1 if mode == "GOVERNANCE" else 3)


def test_a_create_after_a_delete_starts_a_new_generation(s3_lock_bucket: S3Bucket) -> None:
    tiers = [s3_lock_bucket.tier() for _ in range(3)]
    tiers[0].put("g", b"old", mode=PutMode.CREATE)
    assert tiers[0].delete("g")  # a delete marker: the old version no longer counts
    outcomes = race(tiers, "g", [b"a", b"b", b"c"], force=True)
    assert outcomes.count(None) == 1, outcomes
    assert tiers[0].get("g") == [b"a", b"b", b"c"][outcomes.index(None)]
    assert len(tiers[0].object_versions("g")) == 2  # the deleted one and the winner


def test_version_order_is_the_servers_not_the_clock(s3_lock_bucket: S3Bucket) -> None:
    # Concurrent PUTs list out of LastModified order on Ceph RGW; the newest listed
    # version must still be the one a GET returns.
    tier = s3_lock_bucket.tier()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: tier.put("o", f"v{i}".encode()), range(16), timeout=60))
    versions = tier.object_versions("o")
    assert len(versions) == 16
    assert versions[0] == latest_version(s3_lock_bucket, "o")
    tier.delete("o")
    tier.put("o", b"after")
    history = version_history(tier._control, "o")
    assert [e.delete_marker for e in history[:2]] == [False, True]
    assert [e.version_id for e in history if not e.delete_marker] == tier.object_versions("o")


@pytest.mark.parametrize(
    ("history", "ours", "expected"),
    [
        (["v:a"], "a", []),  # alone: won
        (["v:b", "v:a"], "b", ["a"]),  # a is older: lost
        (["v:b", "v:a"], "a", []),  # b came later: a won
        (["v:c", "m:x", "v:a"], "c", []),  # a was deleted before c: a new generation
        (["v:c", "v:b", "m:x", "v:a"], "c", ["b"]),  # b is c's generation: c lost
        (["m:y", "v:b", "v:a"], "a", []),  # deleted after it won: still won
        (["v:b"], "a", None),  # ours is not listed: undecidable
    ],
)
def test_rivals(history: list[str], ours: str, expected: list[str] | None) -> None:
    entries = [VersionEntry(e[2:], e.startswith("m:")) for e in history]
    found = rivals(entries, ours)
    assert (None if found is None else [e.version_id for e in found]) == expected


def test_an_unreadable_version_order_is_an_error() -> None:
    page = {"Versions": [{"Key": "k", "VersionId": "a"}], "DeleteMarkers": []}
    with pytest.raises(TierError, match="order"):
        _merge_page(page, "k")  # no order recorded by the hook


def test_a_read_only_tier_reads_and_refuses_every_write(s3_bucket: S3Bucket) -> None:
    s3_bucket.tier().put("a/b", b"hello")
    tier = s3_bucket.tier(read_only=True)
    assert tier.read_only and tier.get("a/b") == b"hello" and tier.head("a/b").size == 5
    assert list(tier.list("a/")) == ["a/b"]
    # Nothing was measured (nothing was written at open): no capability is claimed.
    assert tier.probe.notes == ("not probed: the tier was opened read-only",)
    assert not tier.capabilities.conditional_put and not tier.capabilities.object_lock
    writes: list[Callable[[], object]] = [
        lambda: tier.put("a/c", b"x"),
        lambda: tier.delete("a/b"),
        lambda: tier.set_tags("a/b", {"k": "v"}),
        lambda: tier.annotate("a/b", {"importance": "critical"}),
        lambda: tier.set_legal_hold("a/b", True),
        lambda: tier.collect_incomplete("a/", 0),
    ]
    for write in writes:
        with pytest.raises(TierError, match="opened read-only"):
            write()
    assert tier.get("a/b") == b"hello" and not tier.exists("a/c")
