"""What an S3 server really does, measured when a tier opens; and how CREATE stays create-only.

:func:`probe_bucket` reads the bucket's versioning and Object Lock settings and
*measures* whether the server refuses a second create-only put (``If-None-Match:
*``); Ceph RGW honours it on plain buckets and ignores it on versioned and
Object-Lock ones. The finding picks the :class:`CreateGuard` of
``S3Tier.put(mode=CREATE)``:

``IF_NONE_MATCH``: the server refuses the second create. Atomic, and a loser's
bytes are never visible; one single PUT (held in memory, at most 5 GiB).

``OLDEST_VERSION``: versioning *Enabled*, header ignored. A creator checks that
the key is absent (HEAD), PUTs (single or multipart), lists the key's versions
in the server's order (:func:`version_history`) and applies one rule: **the
oldest version since the newest delete marker wins**. A loser deletes its own
version by id, so the winner's is the latest again, and raises
``ObjectExistsError``; where deleting is refused (a default COMPLIANCE
retention, permissions) it covers its version with a server-side copy of the
winner's instead (:func:`settle_versioned_create`).

``EXISTENCE_CHECK``: anything else (header ignored without versioning, or
versioning *Suspended*): HEAD, then PUT. Two racing creators can both succeed;
the notes say so and ``capabilities.conditional_put`` is false.

Why at most one creator wins: each lists *after* its own PUT completed, and the
listing is strongly consistent and in one order for every reader (the order in
which the server linked the versions; not ``LastModified``, which concurrent
PUTs do not follow). If A and B see each other, they agree on the older. If A
listed before B's PUT completed, B's later listing shows A as older. And since
the checkpoint writer stops at its first ``ObjectExistsError``, a writer whose
manifest wins also won every data object that manifest names.

Residual risks of ``OLDEST_VERSION``. None lets two creators both succeed, nor a
reader accept a mix of two writers' bytes (every byte is checked against the
manifest's checksums), but:

* From the end of a loser's PUT to its cleanup (a LIST and a DELETE, some
  milliseconds), a plain GET returns the *loser's* bytes. A reader in that
  window rejects the winner's copy as damaged; a verifier (a read-back just
  after the commit) may set it aside, which on a versioned bucket only adds
  delete markers: the winner's versions survive.
* A loser that dies between PUT and cleanup leaves its version on top: the
  winner's copy reads as damaged until that version is deleted.
* Racing writers' data objects interleave under the one final prefix: with
  ranks in several processes, A may win rank 0 and B rank 1. Both then fail
  and neither may commit; what they wrote is uncommitted garbage.
* A PUT that obstore retried after the first attempt was stored (the reply was
  lost) leaves two versions of the same bytes: the creator loses to itself,
  as a retried ``If-None-Match`` PUT gets 412. Safe, but misleading.
* A creator that cannot list the versions raises ``TierError`` and undoes
  nothing: its object may be the winner, like any write whose reply was lost.
* Versioning is read at open; suspended later, PUTs replace the ``null``
  version and the rule can no longer tell creators apart.
* Overwrites and deletes racing a create are ordered like any write: an older
  overwrite makes the create lose; a delete marker starts a new generation.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import obstore
import obstore.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from mouthguard.errors import ObjectExistsError, TierError
from mouthguard.tiers.s3_control import OBSTORE_ERRORS, error_code

if TYPE_CHECKING:
    from obstore.store import S3Store

    from mouthguard.tiers.s3_control import S3Control

log = logging.getLogger(__name__)

#: Where probe objects go, under the tier's prefix: dot-named, so never a valid
#: key (no caller can collide with it) and never listed.
PROBE_DIR = ".mouthguard-probe"
# Where the after-call hook leaves a ListObjectVersions page's entry order (see _keep_order).
_ORDER = "MouthguardEntryOrder"
_ENTRY_KINDS = frozenset({"Version", "DeleteMarker"})
# Bounds one key's version history: far beyond any create-only key's (1000 per page).
_MAX_VERSION_PAGES = 100


class CreateGuard(enum.Enum):
    """How ``PutMode.CREATE`` keeps a key create-only on one bucket (see the module docstring)."""

    IF_NONE_MATCH = "if-none-match"
    OLDEST_VERSION = "oldest-version"
    EXISTENCE_CHECK = "existence-check"

    @property
    def atomic(self) -> bool:
        """At most one of several concurrent creators of a key succeeds."""
        return self is not CreateGuard.EXISTENCE_CHECK


_GUARD_LINES = {
    CreateGuard.IF_NONE_MATCH: "atomic (the server refuses a second create)",
    CreateGuard.OLDEST_VERSION: "atomic (the oldest version wins; losers remove theirs)",
    CreateGuard.EXISTENCE_CHECK: "NOT atomic (existence check, then put)",
}


@dataclass(frozen=True)
class S3Probe:
    """What the S3 server behind a tier really does, measured when the tier opened.

    Attributes:
        endpoint: the printable endpoint (no credentials).
        bucket: the bucket probed.
        conditional_put: a second create-only put (``If-None-Match: *``) of the
            probe key was refused by the server itself.
        create_guard: how ``PutMode.CREATE`` is kept create-only on this bucket.
        object_lock: Object Lock is enabled (legal holds are available).
        versioning: ``"Enabled"``, ``"Suspended"``, ``"Off"`` or ``"unknown"``.
        default_retention: the bucket's default Object Lock retention, if any.
        notes: human-readable findings, one sentence each, for ``mouthguard doctor``.
        seconds: how long the probe took.
    """

    endpoint: str
    bucket: str
    conditional_put: bool
    create_guard: CreateGuard
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
            f"create-only put: {self.create_guard.value}, {_GUARD_LINES[self.create_guard]}",
            f"object lock: {yes[self.object_lock]}{retention}",
            f"versioning: {self.versioning}",
            *(f"note: {note}" for note in self.notes),
            f"probe took {self.seconds:.2f} s",
        ]


# --- the probe ------------------------------------------------------------------------


def probe_bucket(control: S3Control, store: S3Store) -> S3Probe:
    """Measure what the bucket does: versioning, Object Lock, and real create-only puts.

    A create-only put of a fresh probe key goes twice through ``store`` (the
    tier's own data plane); conditional put counts as honoured only if the
    second is refused. If not, on a versioned bucket, the probe checks what
    ``OLDEST_VERSION`` needs: both puts returned version ids, listed newest
    first. Every version of the probe object is deleted again (bypassing a
    default GOVERNANCE retention), or the notes say what is left. Under a default
    COMPLIANCE retention nothing is written (it would be undeletable): a
    versioned bucket then gets ``OLDEST_VERSION`` unmeasured, and says so.
    What the server refuses becomes a note, never an exception.

    Args:
        control: the tier's control plane (bucket, prefix, botocore client).
        store: the tier's obstore store.
    """
    started = time.monotonic()
    # Registered once, here, while the tier is still private to the opening thread.
    control.client.meta.events.register(
        "after-call.s3.ListObjectVersions", _keep_order, unique_id=_ORDER
    )
    notes: list[str] = []
    versioning = _versioning(control, notes)
    object_lock, retention = _object_lock(control, notes)
    governance = (retention or "").startswith("GOVERNANCE")
    name = f"{PROBE_DIR}/{uuid.uuid4().hex}"
    conditional, ordered, versions = False, False, list[str | None]()
    if (retention or "").startswith("COMPLIANCE"):
        notes.append(
            "conditional put not measured: probe objects would be undeletable under the "
            "default COMPLIANCE retention"
        )
        ordered = versioning == "Enabled"  # assumed: nothing may be written to check it
    else:
        conditional, versions = _measure_create(control, store, name, notes)
        if not conditional and versioning == "Enabled" and len(versions) == 2:
            ordered = _history_matches(control, name, versions, notes)
    if versions:
        try:
            if versioning == "Off":
                obstore.delete(store, name)
            else:
                for entry in version_history(control, name):
                    delete_version(control, name, entry.version_id, bypass_governance=governance)
        except (*OBSTORE_ERRORS, TierError) as exc:
            reason = control.reason(exc)
            notes.append(f"probe object {control.prefix + name!r} not removed ({reason})")
    guard = _choose_guard(conditional, ordered, versioning, notes)
    return S3Probe(
        endpoint=control.endpoint,
        bucket=control.bucket,
        conditional_put=conditional,
        create_guard=guard,
        object_lock=object_lock,
        versioning=versioning,
        default_retention=retention,
        notes=tuple(notes),
        seconds=time.monotonic() - started,
    )


def _choose_guard(
    conditional: bool, ordered: bool, versioning: str, notes: list[str]
) -> CreateGuard:
    if conditional:
        return CreateGuard.IF_NONE_MATCH
    if ordered:
        notes.append(
            "PutMode.CREATE is arbitrated by version order: the oldest version wins and "
            "losers delete theirs (a loser's bytes are visible for milliseconds)"
        )
        return CreateGuard.OLDEST_VERSION
    notes.append(
        f"PutMode.CREATE is NOT atomic here (versioning: {versioning}): an existence check "
        "precedes the put, and two racing creators can both succeed"
    )
    return CreateGuard.EXISTENCE_CHECK


def _versioning(control: S3Control, notes: list[str]) -> str:
    try:
        response = control.client.get_bucket_versioning(Bucket=control.bucket)
    except (ClientError, BotoCoreError) as exc:
        notes.append(f"versioning unreadable ({control.reason(exc)})")
        return "unknown"
    return str(response.get("Status") or "Off")


def _object_lock(control: S3Control, notes: list[str]) -> tuple[bool, str | None]:
    try:
        response = control.client.get_object_lock_configuration(Bucket=control.bucket)
    except ClientError as exc:
        if error_code(exc) not in {"ObjectLockConfigurationNotFoundError", "404"}:
            notes.append(f"Object Lock unreadable ({error_code(exc)}): treated as off")
        return False, None
    except BotoCoreError as exc:
        notes.append(f"Object Lock unreadable ({control.reason(exc)})")
        return False, None
    config = response.get("ObjectLockConfiguration", {})
    rule = config.get("Rule", {}).get("DefaultRetention")
    retention = None
    if rule:
        unit = "DAYS" if "Days" in rule else "YEARS"
        retention = f"{rule.get('Mode', '?')} {rule.get('Days') or rule.get('Years')} {unit}"
    return config.get("ObjectLockEnabled") == "Enabled", retention


def _measure_create(
    control: S3Control, store: S3Store, name: str, notes: list[str]
) -> tuple[bool, list[str | None]]:
    """Return whether If-None-Match was enforced, and the version ids of what was written."""
    written: list[str | None] = []
    for body in (b"mouthguard probe 1", b"mouthguard probe 2"):
        try:
            result = obstore.put(store, name, body, mode="create", use_multipart=False)
        except (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
            notes.append("a second create-only put of the probe key was refused: CREATE is atomic")
            return True, written
        except OBSTORE_ERRORS as exc:
            reason = control.reason(exc)
            notes.append(f"probe write failed ({reason}): conditional put treated as not honoured")
            return False, written
        written.append(result.get("version"))
    notes.append(
        "the server IGNORED If-None-Match: a second create-only put of the probe key succeeded"
    )
    return False, written


def _history_matches(
    control: S3Control, name: str, versions: list[str | None], notes: list[str]
) -> bool:
    """Whether the probe's two puts are listed, newest first, under the ids the puts returned."""
    if not all(versions):
        notes.append("the server returned no version ids: creates cannot be arbitrated")
        return False
    try:
        history = version_history(control, name)
    except TierError as exc:
        notes.append(f"the probe key's versions are unreadable ({exc})")
        return False
    listed = [entry.version_id for entry in history]
    if listed != versions[::-1]:
        notes.append(f"the probe's versions {versions} are listed as {listed}: not arbitrable")
        return False
    return True


# --- versions in the server's order ---------------------------------------------------


@dataclass(frozen=True)
class VersionEntry:
    """One entry of an object's version history: a version, or a delete marker."""

    version_id: str
    delete_marker: bool


def _keep_order(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
    """Keep the order of a ListObjectVersions page's entries (a botocore ``after-call`` hook).

    botocore parses a page into two lists, ``Versions`` and ``DeleteMarkers``,
    losing how they interleave. That interleaving is the server's own record of
    which write came after which; timestamps are not (concurrent PUTs list out of
    ``LastModified`` order on Ceph RGW, and AWS lists whole seconds). Each list
    keeps document order, so the sequence of element kinds is enough to merge
    them back. A body that does not parse leaves no order: the caller then fails.
    """
    if http_response.status_code >= 300:
        return
    try:
        # The body comes from the configured endpoint and botocore has already parsed
        # it with the same expat parser, which resolves no external entities.
        root = ElementTree.fromstring(http_response.content)  # noqa: S314
    except ElementTree.ParseError:
        return
    kinds = (child.tag.rpartition("}")[2] for child in root)
    parsed[_ORDER] = [kind for kind in kinds if kind in _ENTRY_KINDS]


def _merge_page(page: Mapping[str, Any], full_key: str) -> list[VersionEntry]:
    """The entries of one ListObjectVersions page for ``full_key``, in document order."""
    order: list[str] | None = page.get(_ORDER)
    versions, markers = page.get("Versions", []), page.get("DeleteMarkers", [])
    if order is None or sorted(order) != sorted(
        ["Version"] * len(versions) + ["DeleteMarker"] * len(markers)
    ):
        raise TierError(f"cannot read the order of the versions of {full_key!r}")
    sources = {"Version": iter(versions), "DeleteMarker": iter(markers)}
    merged = (next(sources[kind]) | {"Kind": kind} for kind in order)
    return [
        VersionEntry(str(item["VersionId"]), item["Kind"] == "DeleteMarker")
        for item in merged
        if item["Key"] == full_key
    ]


def version_history(control: S3Control, key: str) -> list[VersionEntry]:
    """Versions and delete markers of exactly ``key``, newest first, in the server's order.

    Never re-sorted by time: the first entry is what a plain GET sees, and every
    reader sees the same order. Needs the hook that :func:`probe_bucket` installs.

    Raises:
        TierError: the listing failed, or its order could not be read.
    """
    full_key, entries = control.prefix + key, list[VersionEntry]()
    markers: dict[str, str] = {}
    with control.errors("list the versions of", key):
        for _ in range(_MAX_VERSION_PAGES):
            page = control.client.list_object_versions(
                Bucket=control.bucket, Prefix=full_key, **markers
            )
            entries += _merge_page(page, full_key)
            # Keys sort after their own prefix: past full_key means past its versions.
            if not page.get("IsTruncated") or page.get("NextKeyMarker") != full_key:
                return entries
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "VersionIdMarker": page["NextVersionIdMarker"],
            }
    raise TierError(f"{key!r} has more than {_MAX_VERSION_PAGES} pages of versions")


def delete_version(
    control: S3Control, key: str, version_id: str, *, bypass_governance: bool
) -> None:
    """Delete one version (or delete marker) of ``key`` for good.

    ``bypass_governance`` also removes a version under GOVERNANCE retention
    (with the ``s3:BypassGovernanceRetention`` permission).

    Raises:
        TierError: refused (COMPLIANCE retention, a legal hold, no permission).
    """
    bypass = {"BypassGovernanceRetention": True} if bypass_governance else {}
    with control.errors(f"delete version {version_id} of", key):
        control.client.delete_object(
            Bucket=control.bucket, Key=control.prefix + key, VersionId=version_id, **bypass
        )


def restore_version(control: S3Control, key: str, version_id: str) -> None:
    """Make a server-side copy of ``version_id`` (bytes, metadata, tags) ``key``'s latest.

    Raises:
        TierError: refused, or the object is over CopyObject's 5 GiB.
    """
    source = {"Bucket": control.bucket, "Key": control.prefix + key, "VersionId": version_id}
    with control.errors(f"restore version {version_id} of", key):
        control.client.copy_object(
            Bucket=control.bucket, Key=control.prefix + key, CopySource=source
        )


# --- arbitration of OLDEST_VERSION -------------------------------------------------------


def rivals(history: Sequence[VersionEntry], version_id: str) -> list[VersionEntry] | None:
    """The versions older than ``version_id`` in its generation, newest first.

    A generation starts after a delete marker: what came before was deleted.
    ``None`` when ``version_id`` is not in ``history`` at all.
    """
    ids = [entry.version_id for entry in history]
    if version_id not in ids:
        return None
    older: list[VersionEntry] = []
    for entry in history[ids.index(version_id) + 1 :]:
        if entry.delete_marker:
            break
        older.append(entry)
    return older


def settle_versioned_create(
    control: S3Control, key: str, version_id: str | None, *, bypass_governance: bool
) -> None:
    """Decide a create-only put that already stored ``version_id``: keep it, or undo it.

    Call right after the PUT returned. Returns if ``version_id`` is the oldest
    version of its generation (the create won). Otherwise removes it by id, or
    where that is refused puts a copy of the winner's version on top, so a plain
    GET sees the winner's bytes again, and raises.

    Args:
        control: the tier's control plane.
        key: the object key.
        version_id: the version the PUT returned.
        bypass_governance: the bucket's default retention is GOVERNANCE.

    Raises:
        ObjectExistsError: an older version of the key exists: the create lost.
        TierError: the outcome cannot be decided (no version id, the history is
            unreadable, or our version vanished); nothing is undone then.
    """
    where = f"s3://{control.bucket}/{control.prefix}{key} at {control.endpoint}"
    if not version_id:
        raise TierError(f"cannot settle the create of {where}: the PUT returned no version id")
    older = rivals(version_history(control, key), version_id)
    if older is None:
        raise TierError(f"cannot settle the create of {where}: version {version_id} is gone")
    if not older:
        return
    winner = older[-1].version_id
    lost = f"{where} already exists: a concurrent create stored {winner} before our {version_id}"
    try:
        delete_version(control, key, version_id, bypass_governance=bypass_governance)
    except TierError as refused:
        try:  # undeletable (retention, permissions): the winner's bytes go back on top
            restore_version(control, key, winner)
        except TierError as failed:
            log.warning("%s; ours is neither deleted (%s) nor covered (%s)", lost, refused, failed)
            raise ObjectExistsError(f"{lost}; ours stays on top: {failed}") from None
        raise ObjectExistsError(f"{lost}; a copy of the winner's now covers ours") from None
    raise ObjectExistsError(f"{lost}; ours was removed")
