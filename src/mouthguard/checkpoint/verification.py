"""Verifying a committed copy and recording what was found: the one rule for damage.

Every part of mouthguard that reads a whole copy back to judge it (``verify``,
the scrubber, the replicator, a copy's read-back, retention before a demotion, a
save that finds its step already committed) goes through
:func:`verify_and_record`, so they all reach the same :class:`Verdict` and leave
the same traces:

============  =====================================================  ===================
status        what it means                                          what is recorded
============  =====================================================  ===================
``ok``        every byte matched the manifest                        a fresh receipt; any
                                                                     damage report cleared
``damaged``   proven damage (:func:`mouthguard.errors.is_data_damage`:  a damage report (the
              checksum, format, a missing file)                      receipt stops vouching)
``unreachable``  the tier failed (I/O error, timeout, dead store), or   nothing: a transient
              the bytes cannot be authenticated with the keys this   error proves nothing
              process has                                            about the bytes
============  =====================================================  ===================

Verdicts are about the bytes. When the record cannot be written (a read-only
store, a tier that fails on the write), the verdict stands and says so in
``record_error``: an intact copy is never reported invalid because its receipt
could not be stored.

Nothing here moves or deletes a copy. Setting a copy aside needs confirmed
damage: :func:`confirm_damage` (a second, independent read) is what
:func:`mouthguard.checkpoint.quarantine.set_aside_confirmed` asks first.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import Pause, read_manifest, verify_copy
from mouthguard.checkpoint.sidecars import CopyRef, clear_damage, report_damage, write_receipt
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError, ObjectNotFoundError, is_data_damage
from mouthguard.format.manifest import Manifest
from mouthguard.format.typed_json import JsonValue
from mouthguard.tiers.key_material import Keyring


class Status(enum.Enum):
    """The verdict on one copy's bytes."""

    OK = "ok"
    DAMAGED = "damaged"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Verdict:
    """What one read-back of a whole copy found.

    Attributes:
        run, step: the checkpoint.
        tier: the name of the tier holding the copy.
        location: where the copy lives (a directory or URL prefix).
        status: ok, damaged (proven) or unreachable (nothing proven).
        reason: why it is not ok ("" when ok).
        nbytes: bytes of the copy's files as its manifest records them (0 when
            the manifest could not be read).
        record_error: why the receipt or damage report could not be written
            ("" when it was, or when nothing was to be recorded).
    """

    run: str
    step: int
    tier: str
    location: str
    status: Status
    reason: str = ""
    nbytes: int = 0
    record_error: str = ""

    @property
    def ok(self) -> bool:
        """Whether every byte of the copy matched its manifest."""
        return self.status is Status.OK

    @property
    def damaged(self) -> bool:
        """Whether the copy is proven damaged (a repair may replace it)."""
        return self.status is Status.DAMAGED

    def to_json(self) -> dict[str, JsonValue]:
        """One JSON object per copy, as ``verify --json`` and ``scrub --json`` print it."""
        return {
            "run": self.run,
            "step": self.step,
            "tier": self.tier,
            "location": self.location,
            "ok": self.ok,
            "status": self.status.value,
            "reason": self.reason,
            "nbytes": self.nbytes,
            "recorded": not self.record_error,
            "record_error": self.record_error,
        }


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def verify_and_record(
    ref: CopyRef,
    *,
    keys: Keyring | None = None,
    record: bool = True,
    now: Callable[[], dt.datetime] = _utc_now,
    pause: Pause | None = None,
) -> Verdict:
    """Read every byte of the committed copy ``ref``, judge it, and record the judgement.

    Never raises for bad data or a failing tier: every outcome is a :class:`Verdict`.
    With ``record=False`` nothing is written (a dry look).

    Contract: ``ok`` writes a receipt naming the manifest's checksum and clears
    any damage report; ``damaged`` writes a damage report (which also withdraws
    the receipt); ``unreachable`` writes nothing. A failed write changes only
    ``record_error``, never the status.

    ``pause`` is called between chunks of the read: background jobs pass their
    burst gate's ``wait`` so that a long read-back yields the disk to a save.
    """
    location = ref.tier.location(ref.prefix)
    manifest: Manifest | None = None
    try:
        manifest = read_manifest(ref.tier, ref.run, ref.step, keys)
        verify_copy(ref.tier, ref.prefix, manifest, pause=pause)
        raw = ref.tier.get(catalog.manifest_key(ref.run, ref.step)) if record else b""
    except MouthguardError as exc:
        nbytes = manifest.nbytes if manifest is not None else 0
        status = Status.DAMAGED if is_data_damage(exc) else Status.UNREACHABLE
        reason = str(exc)
        if isinstance(exc, ObjectNotFoundError) and not _still_committed(ref):
            # Set aside or deleted while we read: nothing left to judge or to mark
            # (a damage report would recreate the directory it was moved from).
            status, reason = Status.UNREACHABLE, f"no longer committed on this tier ({exc})"
        verdict = Verdict(ref.run, ref.step, ref.tier.name, location, status, reason, nbytes)
        if record and status is Status.DAMAGED:
            verdict = _record(verdict, lambda: report_damage(ref, reason, now()))
        return verdict
    verdict = Verdict(ref.run, ref.step, ref.tier.name, location, Status.OK, "", manifest.nbytes)
    if not record:
        return verdict
    return _record(verdict, lambda: _record_intact(ref, raw, now()))


def _still_committed(ref: CopyRef) -> bool:
    try:
        return ref.tier.exists(catalog.manifest_key(ref.run, ref.step))
    except MouthguardError:
        return True  # cannot tell: keep the verdict the read gave


def _record_intact(ref: CopyRef, manifest_bytes: bytes, when: dt.datetime) -> None:
    write_receipt(ref, manifest_bytes, when)
    clear_damage(ref)


def _record(verdict: Verdict, write: Callable[[], None]) -> Verdict:
    try:
        write()
    except MouthguardError as exc:
        return Verdict(
            verdict.run,
            verdict.step,
            verdict.tier,
            verdict.location,
            verdict.status,
            verdict.reason,
            verdict.nbytes,
            record_error=str(exc),
        )
    return verdict


def confirm_damage(ref: CopyRef, *, keys: Keyring | None = None) -> bool:
    """Whether a second, independent read of the whole copy also fails as damage.

    A copy is moved or removed only on confirmed damage: one misread (a flipped
    bit in transit, a flaky controller) must never make an intact copy -- perhaps
    the only one -- invisible. Damage on the medium fails every read; a transient
    fault does not. An unreachable tier confirms nothing.
    """
    return verify_and_record(ref, keys=keys, record=False).damaged


def find_copies(
    store: Store,
    run: str | None = None,
    step: int | None = None,
    *,
    unlisted: list[str] | None = None,
) -> list[CopyRef]:
    """Committed copies on every tier, optionally of one run (and step), by run, step, tier.

    A copy counts when its manifest exists, whether or not the manifest can be
    read: a copy damaged beyond parsing is exactly what must not be skipped.
    A tier that cannot be listed raises, unless ``unlisted`` is given: then the
    tier is skipped and ``"<tier>: <error>"`` appended to it.
    """
    found: list[CopyRef] = []
    for tier in store.tiers:
        try:
            runs = [run] if run is not None else catalog.list_runs(tier)
            for name in runs:
                found.extend(
                    CopyRef(tier, name, s)
                    for s in catalog.committed_steps(tier, name)
                    if step is None or s == step
                )
        except MouthguardError as exc:
            if unlisted is None:
                raise
            unlisted.append(f"{tier.name}: {exc}")
    return sorted(found, key=lambda r: (r.run, r.step, store.tiers.index(r.tier)))


def verify_all(
    refs: list[CopyRef],
    *,
    keys: Keyring | None = None,
    on_done: Callable[[Verdict], None] | None = None,
) -> Iterator[Verdict]:
    """Verify and record ``refs`` in order, yielding (and reporting) each verdict."""
    for ref in refs:
        verdict = verify_and_record(ref, keys=keys)
        if on_done is not None:
            on_done(verdict)
        yield verdict
