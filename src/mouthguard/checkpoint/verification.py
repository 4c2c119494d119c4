"""Full read-back verification of committed checkpoint copies (``mouthguard verify``).

Every committed copy (a step directory holding ``manifest.json``) on every tier is
checked: the manifest's own checksum and structure, every file's size, safetensors
header and xxh3-128 (and sha256 when recorded). A copy that passes gets a
verification receipt sidecar. Nothing is ever repaired or deleted here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.reader import read_manifest, verify_copy
from mouthguard.checkpoint.sidecars import CopyRef, write_receipt
from mouthguard.checkpoint.store import Store
from mouthguard.errors import MouthguardError
from mouthguard.format.manifest import Manifest
from mouthguard.tiers.base import Tier


@dataclass(frozen=True)
class CopyReport:
    """The verdict on one copy."""

    run: str
    step: int
    tier: str
    location: str
    ok: bool
    reason: str
    nbytes: int


@dataclass(frozen=True)
class CopyTarget:
    """A committed copy to verify."""

    run: str
    step: int
    tier: Tier


def find_copies(store: Store, run: str | None = None, step: int | None = None) -> list[CopyTarget]:
    """Committed copies on every tier, optionally restricted to one run and step."""
    targets: list[CopyTarget] = []
    for tier in store.tiers:
        runs = [run] if run is not None else catalog.list_runs(tier)
        for name in runs:
            targets.extend(
                CopyTarget(name, found, tier)
                for found in catalog.committed_steps(tier, name)
                if step is None or found == step
            )
    return sorted(targets, key=lambda t: (t.run, t.step, store.tiers.index(t.tier)))


def verify_target(target: CopyTarget, *, record_receipt: bool = True) -> CopyReport:
    """Read every byte of one copy and judge it. Never raises for bad data."""
    prefix = catalog.checkpoint_prefix(target.run, target.step)
    location = target.tier.location(prefix)
    manifest: Manifest | None = None
    try:
        manifest = read_manifest(target.tier, target.run, target.step)
        verify_copy(target.tier, prefix, manifest)
        if record_receipt:
            raw = target.tier.get(catalog.manifest_key(target.run, target.step))
            write_receipt(
                CopyRef(target.tier, target.run, target.step), raw, dt.datetime.now(dt.UTC)
            )
    except MouthguardError as exc:
        nbytes = manifest.nbytes if manifest is not None else 0
        return CopyReport(
            target.run, target.step, target.tier.name, location, False, str(exc), nbytes
        )
    return CopyReport(
        target.run, target.step, target.tier.name, location, True, "ok", manifest.nbytes
    )


def verify_all(
    targets: list[CopyTarget], *, on_done: Callable[[CopyReport], None] | None = None
) -> Iterator[CopyReport]:
    """Verify ``targets`` in order, yielding (and reporting) each verdict."""
    for target in targets:
        report = verify_target(target)
        if on_done is not None:
            on_done(report)
        yield report
