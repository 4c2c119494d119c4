"""The audit trail on the tiers: append-only, hash-chained, one object per record.

Every act on a checkpoint (commit, importance change, hold and release, trash,
restore, purge, demotion, set-aside, copy, damage found, suspect mark) goes
through :func:`audited`::

    with audited("hold", run, step, tiers, reason, actor=..., keys=...) as outcome:
        ... the act ...                  # outcome.result = "not needed" if it was

which, in this order,

1. appends an **intent** record to the trail of every tier the act touches
   (persistent tiers only, where it touches any: a RAM tier's trail dies with
   the process). If that fails, the act is not done: the error is raised
   before it starts, so no act goes unrecorded;
2. runs the act;
3. appends an **outcome** record (``done``, ``not needed``, or ``failed`` with
   the error) naming its intent. Best effort: an outcome that cannot be
   written is logged, and the trail then shows the intent without an outcome
   -- exactly what a crash (``kill -9``) between 2 and 3 leaves too.

Layout: ``_audit/<seq:012d>.json`` at the root of each tier, record ``seq``
chained to record ``seq - 1`` (:mod:`mouthguard.format.audit_record`). Records
are put **create-only** and never overwritten or deleted by mouthguard. Two
writers (two processes, or a trainer and its background replicator) appending at
once both try the same next number; the tier's create-only put lets exactly one
win, and the other re-reads the new head and retries with the number after it
(at most :data:`MAX_RACES` times). Where a tier cannot make create-only atomic
(``capabilities.conditional_put`` false: an S3 bucket with versioning whose
server ignores ``If-None-Match``), the tier's own arbitration picks the winner
(:mod:`mouthguard.tiers.s3.create`).

Cost: each process keeps the head (next number, digest of the last record) of
each tier's trail in memory, one small entry per tier object it has written
through (freed with the tier); the first append lists the trail once, later ones
write one object each. ``_audit`` is reserved: no run may take that name.

``MOUTHGUARD_AUDIT=off`` turns the trail off (for measuring its cost; a store
written that way proves nothing about those acts).
"""

from __future__ import annotations

import datetime as dt
import getpass
import logging
import os
import re
import socket
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from mouthguard.errors import MouthguardError, ObjectExistsError, ObjectNotFoundError, TierError
from mouthguard.format.audit_record import (
    GENESIS,
    AuditRecord,
    AuditRecordError,
    StoredRecord,
    decode,
    encode,
    record_digest,
)
from mouthguard.format.signing import keys_from_env
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.key_material import Keyring

log = logging.getLogger(__name__)

TRAIL_DIR = "_audit"
ENV_ACTOR = "MOUTHGUARD_ACTOR"
ENV_SWITCH = "MOUTHGUARD_AUDIT"
#: How often one append retries after losing the create-only race to another writer.
MAX_RACES = 64
_NAME = re.compile(r"(\d{12})\.json")


def record_key(seq: int) -> str:
    """The object key of record ``seq``."""
    return f"{TRAIL_DIR}/{seq:012d}.json"


def enabled() -> bool:
    """Whether acts are recorded (``$MOUTHGUARD_AUDIT`` is not ``off``/``0``/``false``)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def default_actor() -> str:
    """``$MOUTHGUARD_ACTOR``, else ``user@host`` of this process."""
    given = os.environ.get(ENV_ACTOR, "").strip()
    if given:
        return given
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def trail_keys(keys: Keyring | None) -> Keyring | None:
    """The keys records are signed with: the store's manifest keys, else the environment's."""
    return keys if keys is not None else keys_from_env()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


# --- appending ---------------------------------------------------------------------------


@dataclass
class _Head:
    """Where one tier's trail continues: its next number and the last record's digest."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    next: int | None = None
    prev: str = GENESIS


_heads: weakref.WeakKeyDictionary[Tier, _Head] = weakref.WeakKeyDictionary()
_heads_lock = threading.Lock()


def _head(tier: Tier) -> _Head:
    with _heads_lock:
        head = _heads.get(tier)
        if head is None:
            head = _heads[tier] = _Head()
        return head


def _seqs(tier: Tier) -> list[int]:
    """The numbers of the records in ``tier``'s trail, ascending (foreign names skipped)."""
    found = []
    for key in tier.list(TRAIL_DIR + "/"):
        match = _NAME.fullmatch(key[len(TRAIL_DIR) + 1 :])
        if match is not None:
            found.append(int(match.group(1)))
    return sorted(found)


def _load(tier: Tier, head: _Head) -> None:
    seqs = _seqs(tier)
    if not seqs:
        head.next, head.prev = 0, GENESIS
        return
    head.next, head.prev = seqs[-1] + 1, record_digest(tier.get(record_key(seqs[-1])))


def _catch_up(tier: Tier, head: _Head) -> None:
    """Step past records other writers appended since this process last looked."""
    assert head.next is not None
    while True:
        try:
            raw = tier.get(record_key(head.next))
        except ObjectNotFoundError:
            return
        head.next, head.prev = head.next + 1, record_digest(raw)


def append(tier: Tier, record: AuditRecord, keys: Keyring | None = None) -> int:
    """Append ``record`` to ``tier``'s trail, create-only; return its number.

    Raises:
        TierError: the tier failed, or other writers won the race
            :data:`MAX_RACES` times in a row.
    """
    head = _head(tier)
    with head.lock:
        if head.next is None:
            _load(tier, head)
        for _ in range(MAX_RACES):
            assert head.next is not None
            raw = encode(record, head.next, head.prev, keys)
            try:
                tier.put(record_key(head.next), raw, mode=PutMode.CREATE)
            except ObjectExistsError:
                _catch_up(tier, head)  # another writer took the number: follow it
                continue
            seq, head.next, head.prev = head.next, head.next + 1, record_digest(raw)
            return seq
    raise TierError(f"audit trail on {tier.name!r}: lost the append race {MAX_RACES} times")


# --- acts --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the act inside :func:`audited` reports: ``done`` unless it says otherwise."""

    result: str = "done"
    detail: str = ""


def _trail_tiers(tiers: Iterable[Tier]) -> list[Tier]:
    unique = list({id(t): t for t in tiers}.values())
    persistent = [t for t in unique if t.capabilities.persistent]
    return persistent or unique


@contextmanager
def audited(  # noqa: PLR0917 - one record's whole content
    act: str,
    run: str,
    step: int | None,
    tiers: Sequence[Tier],
    reason: str = "",
    actor: str | None = None,
    keys: Keyring | None = None,
    extra: Iterable[tuple[str, str]] = (),
) -> Iterator[Outcome]:
    """Record the intent of ``act``, run the body, record its outcome (module doc).

    Raises:
        TierError: the intent could not be recorded; the body did not run.
    """
    outcome = Outcome()
    if not enabled():
        yield outcome
        return
    targets = _trail_tiers(tiers)
    keys = trail_keys(keys)
    who = actor or default_actor()
    names = tuple(t.name for t in targets)
    extra = tuple(sorted(extra))
    intent = AuditRecord(
        uuid.uuid4().hex, "intent", act, _now(), who, run, step, names, reason, extra=extra
    )
    written: list[Tier] = []
    try:
        for tier in targets:
            append(tier, intent, keys)
            written.append(tier)
    except MouthguardError as exc:
        _finish(written, intent, Outcome("failed", f"intent not recorded everywhere: {exc}"), keys)
        what = f"cannot record {act} of {run} step {step} in the audit trail: {exc}"
        raise TierError(what) from exc
    try:
        yield outcome
    except BaseException as exc:
        _finish(written, intent, Outcome("failed", f"{type(exc).__name__}: {exc}"), keys)
        raise
    _finish(written, intent, outcome, keys)


def _finish(tiers: list[Tier], intent: AuditRecord, outcome: Outcome, keys: Keyring | None) -> None:
    record = AuditRecord(
        uuid.uuid4().hex,
        "outcome",
        intent.act,
        _now(),
        intent.actor,
        intent.run,
        intent.step,
        intent.tiers,
        intent.reason,
        of=intent.id,
        result=outcome.result,
        detail=outcome.detail[:2000],
        extra=intent.extra,
    )
    for tier in tiers:
        try:
            append(tier, record, keys)
        except MouthguardError as exc:  # the intent stands alone: the trail says so
            log.warning("cannot record the outcome of %s on %s: %s", intent.act, tier.name, exc)


# --- reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One object of a tier's trail: its number (from its name) and the record, or why not."""

    tier: str
    seq: int
    stored: StoredRecord | None
    error: str = ""


def read_trail(tier: Tier, newest: int | None = None) -> list[Entry]:
    """The records of ``tier``'s trail in number order; unreadable ones with the reason.

    Every record, or with ``newest`` only the last ``newest`` of them (one listing, then
    one read each). Holds what it read in memory: records are at most 16 KiB, typically
    ~500 B, so a view that refreshes (the page) passes ``newest`` to stay bounded.
    """
    seqs = _seqs(tier)
    if newest is not None:
        seqs = seqs[-newest:] if newest > 0 else []
    entries = []
    for seq in seqs:
        try:
            entries.append(Entry(tier.name, seq, decode(tier.get(record_key(seq)))))
        except AuditRecordError as exc:
            entries.append(Entry(tier.name, seq, None, str(exc)))
        except ObjectNotFoundError:
            entries.append(Entry(tier.name, seq, None, "removed while reading"))
    return entries


__all__ = [
    "ENV_ACTOR",
    "ENV_SWITCH",
    "MAX_RACES",
    "TRAIL_DIR",
    "Entry",
    "Outcome",
    "append",
    "audited",
    "default_actor",
    "enabled",
    "read_trail",
    "record_key",
    "trail_keys",
]
