"""What an S3 server really does, measured when a tier opens.

:func:`probe_bucket` reads the bucket's versioning and Object Lock settings and
*measures* whether the server refuses a second create-only put (``If-None-Match:
*``); Ceph RGW honours it on plain buckets and ignores it on versioned and
Object-Lock ones. The finding picks the
:class:`~mouthguard.tiers.s3.create.CreateGuard` of ``S3Tier.put(mode=CREATE)``
(the guards, their protocol and its residual risks are documented there): the
server's own refusal where it is honoured, else the oldest-version rule where
versioning is enabled and the server lists the probe's versions in the order
they were written, else a racy existence check, reported as such.

The findings (:class:`S3Probe`) are what ``mouthguard doctor`` prints.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import obstore
import obstore.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from mouthguard.errors import TierError
from mouthguard.tiers.s3.create import CreateGuard
from mouthguard.tiers.s3.errors import OBSTORE_ERRORS, error_code
from mouthguard.tiers.s3.versions import delete_version, record_version_order, version_history

if TYPE_CHECKING:
    from obstore.store import S3Store

    from mouthguard.tiers.s3.control import S3Control

#: Where probe objects go, under the tier's prefix: dot-named, so never a valid
#: key (no caller can collide with it) and never listed.
PROBE_DIR = ".mouthguard-probe"

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


def unprobed(control: S3Control, why: str) -> S3Probe:
    """The findings of a probe that did not run (``why``): nothing claimed, the racy guard."""
    return S3Probe(
        endpoint=control.endpoint,
        bucket=control.bucket,
        conditional_put=False,
        create_guard=CreateGuard.EXISTENCE_CHECK,
        object_lock=False,
        versioning="unknown",
        default_retention=None,
        notes=(f"not probed: {why}",),
        seconds=0.0,
    )


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
    record_version_order(control)
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
