"""Where checkpoints live on a tier, and how to find the committed ones.

Layout on every tier::

    <run>/<step:012d>/rank-00000.safetensors
    <run>/<step:012d>/manifest.json            # present = committed on this tier
    <run>/<step:012d>/sidecar.<kind>.json       # mutable facts (receipts, holds, ...)
    <run>/<step:012d>.partial-<id>/...          # a save in progress, or its leftovers
    <run>/<step:012d>.rejected-<id>/...         # a damaged checkpoint set aside by a re-save

Only directories named exactly twelve digits and holding ``manifest.json`` are
checkpoints. Everything else under a run is invisible to readers; partial
directories are garbage once older than a grace period.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from mouthguard.checkpoint.audit import TRAIL_DIR
from mouthguard.errors import InvalidKeyError, MouthguardError
from mouthguard.format.manifest import MANIFEST_NAME
from mouthguard.tiers.base import Tier
from mouthguard.tiers.object_keys import validate_segment

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"\d{12}")
_PARTIAL_DIR = re.compile(r"(\d{12})\.partial-([0-9a-f]{8,64})")
RANK_FILE_PATTERN = "rank-{rank:05d}.safetensors"


def validate_run(run: str) -> str:
    """Return ``run`` if it is a valid run name (a safe path segment), else raise."""
    if run == TRAIL_DIR:
        raise ValueError(f"invalid run name {run!r}: reserved for the audit trail")
    try:
        return validate_segment(run)
    except InvalidKeyError:
        raise ValueError(
            f"invalid run name {run!r}: use letters, digits, '_', '.', '-', '=', '+' "
            "(not starting with '.' or '-')"
        ) from None


def validate_step(step: int) -> int:
    """Return ``step`` if it is a valid step (an integer in [0, 10**12)), else raise ValueError."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**12:
        raise ValueError(f"invalid step {step!r}: must be an integer in [0, 10**12)")
    return step


def step_dir(step: int) -> str:
    """Directory name of a valid ``step`` (zero padded so names sort by step)."""
    return f"{validate_step(step):012d}"


def checkpoint_prefix(run: str, step: int) -> str:
    """Key prefix (ending with ``/``) of a committed checkpoint."""
    return f"{validate_run(run)}/{step_dir(step)}/"


def manifest_key(run: str, step: int) -> str:
    """Key of a committed checkpoint's manifest."""
    return checkpoint_prefix(run, step) + MANIFEST_NAME


def partial_prefix(run: str, step: int, txn: str) -> str:
    """Key prefix (ending with ``/``) of an in-progress save."""
    return f"{validate_run(run)}/{step_dir(step)}.partial-{txn}/"


def new_transaction_id() -> str:
    """A random id naming one attempt (a save's staging area, a set-aside copy)."""
    return uuid.uuid4().hex


def rejected_prefix(run: str, step: int, txn: str) -> str:
    """Key prefix where a damaged committed checkpoint is set aside (invisible to readers)."""
    return f"{validate_run(run)}/{step_dir(step)}.rejected-{txn}/"


def rank_file_name(rank: int) -> str:
    """Name of rank ``rank``'s file."""
    return RANK_FILE_PATTERN.format(rank=rank)


def list_runs(tier: Tier) -> list[str]:
    """Runs that have anything on ``tier`` (the audit trail's directory is not a run)."""
    return [name for name in tier.list_dirs("") if name != TRAIL_DIR]


def step_dirs(tier: Tier, run: str) -> list[int]:
    """Steps that have a (possibly uncommitted) step directory on ``tier``, ascending."""
    return sorted(int(d) for d in tier.list_dirs(f"{validate_run(run)}/") if _STEP_DIR.fullmatch(d))


def committed_steps(tier: Tier, run: str) -> list[int]:
    """Steps whose manifest exists on ``tier``, ascending. Says nothing about validity."""
    return [s for s in step_dirs(tier, run) if tier.exists(manifest_key(run, s))]


def committed_steps_on(
    tiers: Sequence[Tier], run: str, *, include_unsure: bool = False
) -> list[int]:
    """Steps committed on any of ``tiers``, ascending, tolerant of a failing tier.

    A store whose object store is down must still resume from its fast tier: a
    tier that cannot be listed is left out (with a warning) as long as one tier
    answered; if none did, the first tier's error is raised. A step whose
    manifest cannot be looked up counts only with ``include_unsure`` (the
    replicator visits it and reports what fails for that one checkpoint).
    """
    found: set[int] = set()
    failures: list[MouthguardError] = []
    for tier in tiers:
        try:
            dirs = step_dirs(tier, run)
        except MouthguardError as exc:
            log.warning("cannot list %s on tier %s: %s", run, tier.name, exc)
            failures.append(exc)
            continue
        for step in dirs:
            try:
                if tier.exists(manifest_key(run, step)):
                    found.add(step)
            except MouthguardError as exc:
                log.warning("cannot look up %s step %d on tier %s: %s", run, step, tier.name, exc)
                if include_unsure:
                    found.add(step)
    if failures and len(failures) == len(tiers):
        raise failures[0]
    return sorted(found)


def tiers_holding(tiers: Sequence[Tier], run: str, step: int) -> list[Tier]:
    """The tiers (in order) on which ``step`` is committed; a failing tier is skipped."""
    key = manifest_key(run, step)
    holding = []
    for tier in tiers:
        try:
            if tier.exists(key):
                holding.append(tier)
        except MouthguardError as exc:
            log.warning("cannot look up %s on tier %s: %s", key, tier.name, exc)
    return holding


@dataclass(frozen=True)
class PartialSave:
    """Leftovers of a save that never committed on a tier."""

    run: str
    step: int
    prefix: str
    age_seconds: float
    nbytes: int


def partial_saves(tier: Tier, run: str, *, now: float | None = None) -> list[PartialSave]:
    """List in-progress or abandoned saves of ``run`` on ``tier``, with their age.

    Age is measured from the newest object inside, so a slow save that is still
    writing keeps looking young.
    """
    now = time.time() if now is None else now
    found = []
    for name in tier.list_dirs(f"{validate_run(run)}/"):
        match = _PARTIAL_DIR.fullmatch(name)
        if match is None:
            continue
        prefix = f"{run}/{name}/"
        # Sizes and times from the listing; an object gone since is left out.
        infos = list(tier.list_info(prefix))
        if not infos:
            continue  # committed (renamed) or removed since it was listed
        newest = max((i.mtime or 0.0 for i in infos), default=0.0)
        found.append(
            PartialSave(run, int(match.group(1)), prefix, now - newest, sum(i.size for i in infos))
        )
    return found


@dataclass(frozen=True)
class GarbageReport:
    """What one garbage collection removed from one tier."""

    tier: str
    partial_saves: list[PartialSave]
    incomplete_objects: int


def collect_partial_saves(
    tier: Tier, run: str, *, grace_seconds: float, now: float | None = None
) -> GarbageReport:
    """Delete abandoned partial saves older than ``grace_seconds``; report what was removed.

    Two kinds of debris: partial directories holding complete objects (a save
    killed between files), and the tier's own incomplete objects (a save killed
    inside a ``put``: temp files, abandoned uploads), which ``list`` never shows.
    The grace period protects saves still in flight in another process: only
    debris whose newest object is older than the grace is removed. The audit
    trail's folder, which every run writes, is swept too: a process killed while
    appending a record leaves the same kind of debris there.
    """
    incomplete = tier.collect_incomplete(f"{validate_run(run)}/", grace_seconds)
    incomplete += tier.collect_incomplete(f"{TRAIL_DIR}/", grace_seconds)
    removed = []
    for partial in [*partial_saves(tier, run, now=now), *uncommitted_steps(tier, run, now=now)]:
        if partial.age_seconds >= grace_seconds:
            tier.delete_prefix(partial.prefix)
            removed.append(partial)
    return GarbageReport(tier.name, removed, incomplete)


def uncommitted_steps(tier: Tier, run: str, *, now: float | None = None) -> list[PartialSave]:
    """Step directories holding objects but no manifest: never committed, so garbage.

    On object stores (no rename) this is what a failed or killed save leaves; on
    POSIX it only appears when a manifest was lost, and the grace period gives an
    operator time to look before it goes.
    """
    now = time.time() if now is None else now
    found = []
    for step in step_dirs(tier, run):
        if tier.exists(manifest_key(run, step)):
            continue
        prefix = checkpoint_prefix(run, step)
        # Sizes and times from the listing; an object gone since is left out.
        infos = list(tier.list_info(prefix))
        if not infos:
            continue  # deleted (or committed) since it was listed
        newest = max((i.mtime or 0.0 for i in infos), default=0.0)
        found.append(PartialSave(run, step, prefix, now - newest, sum(i.size for i in infos)))
    return found
