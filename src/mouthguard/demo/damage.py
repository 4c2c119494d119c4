"""The demo's damage and its inspection: bit rot and a lost file, done on disk.

The scenario damages committed copies the way the outside world does, not
through mouthguard: it flips bytes in place (:func:`corrupt_checkpoint`) and
deletes a rank file (:func:`delete_rank_file`), both ``fsync``-ed so a later
process meets the damage on disk. Copies are located through the public
``Checkpointer.info`` and the files parsed as plain safetensors, exactly as an
outside tool would see them.

It then looks at what mouthguard made of it: which copies each checkpoint had
(:func:`replica_checks`), which damaged copies were set aside
(:func:`set_aside_copies`), and the full read-back of every committed copy of
the run (:func:`verify_run`, what ``mouthguard verify`` does).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

from mouthguard.checkpoint.checkpointer import Checkpointer
from mouthguard.checkpoint.info import CheckpointInfo, CopyInfo
from mouthguard.checkpoint.store import Store
from mouthguard.checkpoint.verification import find_copies, verify_and_record
from mouthguard.demo import CopyCheck, DamageKind, DamageRecord
from mouthguard.demo.worker import DemoError
from mouthguard.tiers.local import LocalTier

__all__ = [
    "FLIPPED_BYTES",
    "check_local_store",
    "corrupt_checkpoint",
    "delete_rank_file",
    "replica_checks",
    "set_aside_copies",
    "verify_run",
]

#: Bytes flipped by :func:`corrupt_checkpoint`.
FLIPPED_BYTES = 4
_SET_ASIDE = re.compile(r"(\d{12})\.rejected-[0-9a-zA-Z]+")


def check_local_store(store: Store) -> None:
    """Refuse a store whose copies the demo cannot damage on disk.

    Raises:
        DemoError: fewer than two tiers, or a tier that is not a local directory.
    """
    remote = [t.name for t in store.tiers if not isinstance(t, LocalTier)]
    if len(store.tiers) < 2 or remote:
        raise DemoError(
            "the demo damages copies on disk and resumes from a second tier: it needs a store"
            f" of two or more local directory tiers (the default store layout), not {store!r}"
        )


def _copy(checkpointer: Checkpointer, step: int, tier: str | None) -> tuple[CheckpointInfo, Path]:
    """``step``'s info and the directory of its copy on ``tier`` (default: the first copy)."""
    info = checkpointer.info(step)
    assert info is not None  # info() raises rather than return None without missing_ok
    copies: list[CopyInfo] = [c for c in info.copies if tier is None or c.tier == tier]
    if not copies:
        raise DemoError(f"step {step} has no readable copy on tier {tier!r}")
    return info, Path(copies[0].location)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def corrupt_checkpoint(
    checkpointer: Checkpointer, step: int, tier: str | None = None
) -> DamageRecord:
    """Flip a few bytes in the middle of the largest tensor of ``step``'s rank file.

    Args:
        checkpointer: the run's checkpointer (only used to locate the copy).
        step: the committed step to damage.
        tier: the copy to damage; default the first one (the fast tier's, if any).

    Raises:
        DemoError: the copy is not a local file with tensor data.
    """
    info, directory = _copy(checkpointer, step, tier)
    record = info.files[0]
    path = directory / record.name
    with path.open("r+b") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if not 0 < header_len < record.size:
            raise DemoError(f"{path} does not look like a safetensors file")
        header = json.loads(handle.read(header_len))
        spans = {k: v["data_offsets"] for k, v in header.items() if k != "__metadata__"}
        if not spans:
            raise DemoError(f"{path} holds no tensors to corrupt")
        tensor = max(spans, key=lambda k: spans[k][1] - spans[k][0])
        begin, end = spans[tensor]
        offset = 8 + header_len + (begin + end) // 2
        handle.seek(offset)
        original = handle.read(FLIPPED_BYTES)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xFF for b in original))
        handle.flush()
        # Durable like real bit rot: the resume must find the damage on disk.
        os.fsync(handle.fileno())
    where = tier or info.copies[0].tier
    return DamageRecord(step, where, DamageKind.CORRUPTED, path, offset, len(original), tensor)


def delete_rank_file(checkpointer: Checkpointer, step: int, tier: str) -> DamageRecord:
    """Delete the rank file of ``step``'s copy on ``tier`` (its manifest stays: a lost file).

    Raises:
        DemoError: there is no such copy.
    """
    info, directory = _copy(checkpointer, step, tier)
    path = directory / info.files[0].name
    path.unlink()
    _fsync_dir(directory)
    return DamageRecord(step, tier, DamageKind.DELETED, path)


def replica_checks(checkpointer: Checkpointer, steps: Iterable[int]) -> tuple[CopyCheck, ...]:
    """For each step and tier: is there a copy with a valid verification receipt?

    Cheap (no data is read): it reports what replication has vouched for.
    """
    checks = []
    for step in steps:
        info = checkpointer.info(step, missing_ok=True)
        verified = {c.tier for c in info.copies if c.verified} if info is not None else set()
        present = {c.tier for c in info.copies} if info is not None else set()
        for tier in checkpointer.store.tiers:
            ok = tier.name in verified
            reason = "" if ok else "not verified" if tier.name in present else "no copy"
            checks.append(CopyCheck(step, tier.name, ok, reason))
    return tuple(checks)


def set_aside_copies(store: Store, run: str) -> list[tuple[int, str, str]]:
    """``(step, tier, directory name)`` of every damaged copy set aside in ``run``."""
    found = []
    for tier in store.tiers:
        for name in tier.list_dirs(f"{run}/"):
            match = _SET_ASIDE.fullmatch(name)
            if match:
                found.append((int(match.group(1)), tier.name, name))
    return sorted(found)


def verify_run(store: Store, run: str) -> tuple[CopyCheck, ...]:
    """Read back every committed copy of ``run`` on every tier (``mouthguard verify``).

    Like the command, each copy that passes gets a fresh verification receipt.
    """
    checks = []
    for ref in find_copies(store, run):
        report = verify_and_record(ref)
        reason = "" if report.ok else report.reason
        checks.append(CopyCheck(report.step, report.tier, report.ok, reason))
    return tuple(checks)
