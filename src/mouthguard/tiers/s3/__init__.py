"""The S3 tier: objects in a bucket, under an optional prefix, through obstore.

Key ``a/b`` of ``S3Tier("s3://bucket/runs")`` is the S3 object ``runs/a/b``.
obstore (Rust, ``object_store``) carries the bytes. The package's modules have
one job each:

* :mod:`~mouthguard.tiers.s3.tier`: :class:`S3Tier`, the Tier contract kept
  over the modules below.
* :mod:`~mouthguard.tiers.s3.connect`: settings, credentials, both planes' clients.
* :mod:`~mouthguard.tiers.s3.control`: the control plane (botocore) for what
  obstore cannot do: listing, tags, legal holds, abandoned uploads.
* :mod:`~mouthguard.tiers.s3.errors`: both libraries' failures as our TierErrors.
* :mod:`~mouthguard.tiers.s3.probe`: what the server really does, measured at open.
* :mod:`~mouthguard.tiers.s3.create`: how CREATE stays create-only (the guards,
  the oldest-version arbitration and its residual risks, retries after a lost reply).
* :mod:`~mouthguard.tiers.s3.versions`: object versions in the server's order.
* :mod:`~mouthguard.tiers.s3.parts`: a caller's stream regrouped into upload parts.

How the tier keeps the contract of :mod:`mouthguard.tiers.base`:

* **All-or-nothing put.** Up to ``part_size`` bytes go in one PUT; larger
  objects go in a multipart upload of ``part_size`` parts, ``max_concurrency``
  in flight. S3 publishes a multipart object only when the upload completes, so
  readers never see a prefix. If the caller's stream raises, obstore aborts the
  upload and the caller's exception propagates unchanged. A process killed
  mid-upload leaves an invisible upload that :meth:`S3Tier.collect_incomplete`
  aborts.
* **Streams are copied once.** obstore keeps references to the buffers it was
  given until their part is sent, while a streaming caller may refill one buffer
  for every chunk; each chunk is therefore copied into a private part buffer
  (:mod:`~mouthguard.tiers.s3.parts`). A single buffer is passed through
  uncopied (``put`` returns only after the upload, so the caller cannot change
  it meanwhile).
* **Create-only put** is guarded as the open-time probe found possible
  (:class:`~mouthguard.tiers.s3.create.CreateGuard`; its module has the protocol
  and its residual risks): ``If-None-Match: *`` on a single PUT where the server
  enforces it; on versioned buckets that ignore it (Ceph RGW), a PUT of any size,
  then the oldest version wins and losers remove theirs; elsewhere a racy
  HEAD-then-PUT (``capabilities.conditional_put`` false).
* **Ranges are checked against the real size.** S3 silently shortens a range
  that runs past the end; the tier compares it with the object size in the
  response and raises instead.
* **Listing goes through botocore,** not obstore: obstore matches prefixes on
  whole path segments only, and it fails the *whole* listing when one foreign
  object has a name it cannot parse (``a//b``), which would let any other tool
  writing to the bucket hide every checkpoint. Objects whose names are not
  valid keys (the probe's dot-named keys, foreign uploads) are skipped.
* **No rename.** S3 has no atomic rename: ``atomic_rename`` is false and
  ``rename_prefix`` raises :class:`UnsupportedOperationError`.

Errors are :class:`~mouthguard.errors.TierError` subclasses whose message names
the object, the bucket and the endpoint, and never a credential.
"""

from __future__ import annotations

from mouthguard.tiers.s3.connect import warm_up
from mouthguard.tiers.s3.create import CreateGuard
from mouthguard.tiers.s3.probe import S3Probe
from mouthguard.tiers.s3.tier import MAX_PART_SIZE, MIN_PART_SIZE, TAG_PREFIX, S3Tier

__all__ = [
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "TAG_PREFIX",
    "CreateGuard",
    "S3Probe",
    "S3Tier",
    "warm_up",
]
