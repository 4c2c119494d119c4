"""How ``PutMode.CREATE`` stays create-only on S3: the guards, the arbitration, the retries.

The open-time probe (:mod:`mouthguard.tiers.s3.probe`) measures what the server
honours and picks one :class:`CreateGuard` for ``S3Tier.put(mode=CREATE)``:

``IF_NONE_MATCH``: the server refuses the second create. Atomic, and a loser's
bytes are never visible; one single PUT (held in memory, at most 5 GiB).

``OLDEST_VERSION``: versioning *Enabled*, header ignored. A creator checks that
the key is absent (HEAD), PUTs (single or multipart), lists the key's versions
in the server's order (:func:`~mouthguard.tiers.s3.versions.version_history`)
and applies one rule: **the oldest version since the newest delete marker
wins**. A loser deletes its own version by id, so the winner's is the latest
again, and raises ``ObjectExistsError``; where deleting is refused (a default
COMPLIANCE retention, permissions) it covers its version with a server-side
copy of the winner's instead (:func:`settle_versioned_create`).

``EXISTENCE_CHECK``: anything else (header ignored without versioning, or
versioning *Suspended*): HEAD, then PUT. Two racing creators can both succeed;
the probe's notes say so and ``capabilities.conditional_put`` is false.

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

**Create-only single PUTs that survive a lost reply** (``IF_NONE_MATCH``). Such
a PUT is not idempotent, so the S3 client does not retry it after a connection
reset or a timeout -- and when a retry is made after the first request *did*
land, the server answers 412 and our own create looks like someone else's. Both
were found with the fault proxy in ``tests/s3/fault_proxy.py``: a save failed,
or was reported as lost to "another writer", although its objects were
committed with our bytes. :func:`create_with_retries` settles it with what the
caller still holds -- the payload: transient failures are retried with
backoff, and a 412 counts as our own success exactly when the stored object
holds our bytes, byte for byte. (Another writer's byte-identical object is, for
every reader, the same thing.)
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from mouthguard.errors import ObjectExistsError, TierError
from mouthguard.tiers.retry import PERMANENT, backoff_delay
from mouthguard.tiers.s3.versions import (
    VersionEntry,
    delete_version,
    restore_version,
    version_history,
)

if TYPE_CHECKING:
    from mouthguard.tiers.s3.control import S3Control

log = logging.getLogger(__name__)


class CreateGuard(enum.Enum):
    """How ``PutMode.CREATE`` keeps a key create-only on one bucket (see the module docstring)."""

    IF_NONE_MATCH = "if-none-match"
    OLDEST_VERSION = "oldest-version"
    EXISTENCE_CHECK = "existence-check"

    @property
    def atomic(self) -> bool:
        """At most one of several concurrent creators of a key succeeds."""
        return self is not CreateGuard.EXISTENCE_CHECK


# --- OLDEST_VERSION: the oldest version of its generation wins --------------------------


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


# --- IF_NONE_MATCH: retried, and a 412 that holds our bytes is ours ---------------------

T = TypeVar("T")


def create_with_retries(
    send: Callable[[], T],
    stored: Callable[[], bytes | None],
    payload: memoryview,
    *,
    retries: int,
    backoff: tuple[float, float],
) -> T | None:
    """Run the create ``send`` until it succeeds, is refused for good, or retries run out.

    Args:
        send: one create-only PUT of ``payload``; raises TierError subclasses
            (``ObjectExistsError`` for a refused create).
        stored: the object's current bytes, or None if there is none.
        payload: exactly what ``send`` sends.
        retries: how many times a transient failure is retried.
        backoff: ``(initial, maximum)`` delay in seconds, doubled per retry, jittered.

    Returns:
        ``send``'s result, or None when an earlier attempt turned out to have landed.

    Raises:
        ObjectExistsError: the key holds somebody else's bytes.
        TierError: the last failure, once retries are exhausted.
    """
    attempt = 0
    while True:
        try:
            return send()
        except ObjectExistsError:
            if _holds(stored, payload):
                return None  # our own earlier attempt landed; its reply was lost
            raise
        except PERMANENT:
            raise
        except TierError:
            if attempt >= retries:
                raise
            time.sleep(backoff_delay(attempt, backoff))
            attempt += 1


def _holds(stored: Callable[[], bytes | None], payload: memoryview) -> bool:
    try:
        current = stored()
    except TierError:
        return False  # cannot tell: the refusal stands
    return current is not None and len(current) == payload.nbytes and current == payload
