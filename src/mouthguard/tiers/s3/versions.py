"""Object versions in the server's own order: listed, deleted and restored one by one.

On a versioned bucket (Object-Lock buckets always are) every PUT adds a version
and every DELETE a delete marker. The order the server lists them in is its own
record of which write came after which, and the same for every reader; the
timestamps are not (concurrent PUTs list out of ``LastModified`` order on Ceph
RGW, and AWS lists whole seconds). :func:`version_history` keeps that order --
botocore loses it, see :func:`record_version_order` -- and the create
arbitration of :mod:`mouthguard.tiers.s3.create` stands on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

from mouthguard.errors import TierError

if TYPE_CHECKING:
    from mouthguard.tiers.s3.control import S3Control

# Where the after-call hook leaves a ListObjectVersions page's entry order (see _keep_order).
_ORDER = "MouthguardEntryOrder"
_ENTRY_KINDS = frozenset({"Version", "DeleteMarker"})
# Bounds one key's version history: far beyond any create-only key's (1000 per page).
_MAX_VERSION_PAGES = 100


def record_version_order(control: S3Control) -> None:
    """Make ``control``'s client keep the order of ListObjectVersions entries.

    Call once, while the client is still private to one thread (botocore's event
    registration is not meant to race requests); :func:`version_history` needs it.
    Registering again changes nothing (botocore keeps the first hook of a unique id).
    """
    control.client.meta.events.register(
        "after-call.s3.ListObjectVersions", _keep_order, unique_id=_ORDER
    )


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
    reader sees the same order. Needs the hook of :func:`record_version_order`
    (the probe installs it when the tier opens).

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
