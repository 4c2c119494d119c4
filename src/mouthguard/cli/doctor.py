"""``mouthguard doctor``: what each tier really does, and whether the policy fits the store.

For every tier: its kind, location, failure domain and capabilities. Where a
capability was *measured* rather than declared, doctor says so:

* an S3 tier's ``object_lock`` and whether the server honours ``If-None-Match``
  come from the probe the tier ran when it opened
  (:class:`~mouthguard.tiers.s3.S3Probe`), with its notes. The capability
  ``conditional_put`` is the tier's: where the server ignores the header (Ceph
  RGW on versioned buckets) the tier may still keep CREATE atomic another way,
  and doctor names that way (the probe's ``create_guard``);
* every other tier gets a small write probe here: a create-only put of an
  object under the reserved key ``mouthguard-doctor/probe-<uuid>``, a second
  create-only put that must be refused, an annotation (POSIX xattrs on a local
  tier) read back, then the object is deleted again. S3 is not written to here
  because its open-time probe already did, and on a versioned or Object-Lock
  bucket every extra write leaves a version behind.

Then the policy's placement for each importance level on this store's tiers.

Then the latest acts recorded on each checkpoint (the audit trail,
:mod:`mouthguard.checkpoint.audit`; up to :data:`ACTS_SHOWN` per checkpoint for
the :data:`CHECKPOINTS_SHOWN` most recently touched), and a warning for every
break in the trail's chains (``mouthguard audit --check`` names them too).

Warnings do not change the exit code: local tiers declared in distinct failure
domains that sit on one filesystem (one device) are reported, since one disk
failure loses both copies whatever the configuration says.

Exit codes: 0 every level's placement is satisfiable and every probe passed;
1 otherwise, with the reasons printed; 2 usage errors (handled by ``main``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mouthguard.checkpoint.audit import trail_keys
from mouthguard.checkpoint.audit_check import Act, check_store, latest_acts, merged
from mouthguard.checkpoint.gathering import tier_facts
from mouthguard.checkpoint.peer_memory import DEFAULT_PATH as DEFAULT_PEER_PATH
from mouthguard.checkpoint.peer_memory import node_areas
from mouthguard.checkpoint.store import Store
from mouthguard.cli.audit import act_json
from mouthguard.cli.common import EXIT_FAILED, EXIT_OK
from mouthguard.cli.listing import damaged_checkpoints, peer_holdings
from mouthguard.cli.render import human_bytes
from mouthguard.errors import MouthguardError, ObjectExistsError
from mouthguard.format.audit_record import StoredRecord
from mouthguard.policy.importance import Importance
from mouthguard.policy.placement import Placement, placement_for
from mouthguard.tiers.base import PutMode, Tier
from mouthguard.tiers.local import LocalTier

if TYPE_CHECKING:
    from mouthguard.tiers.s3 import S3Probe

#: Reserved prefix of doctor's probe objects (a valid key, never a checkpoint step).
PROBE_PREFIX = "mouthguard-doctor"
_CAPABILITIES = ("atomic_rename", "conditional_put", "object_lock", "durable", "persistent")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor``."""
    doctor = sub.add_parser("doctor", help="check what each tier can do and the policy fits")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument(
        "--peers",
        nargs="?",
        const=DEFAULT_PEER_PATH,
        metavar="PATH",
        help=f"also sum up the peer memory under PATH (default {DEFAULT_PEER_PATH})",
    )


@dataclass
class TierReport:
    """What doctor found about one tier (the ``tiers`` entries of ``--json``)."""

    name: str
    kind: str
    location: str
    domain: str
    capabilities: dict[str, bool]
    measured: dict[str, bool] = field(default_factory=dict)
    create_guard: str | None = None
    hints: str = "n/a"
    hints_work: bool | None = None
    notes: list[str] = field(default_factory=list)
    free_bytes: int | None = None
    total_bytes: int | None = None
    device: int | None = None
    problems: list[str] = field(default_factory=list)


def _s3_probe(tier: Tier) -> S3Probe | None:
    """The open-time probe of an S3 tier; None for other kinds.

    The S3 module (obstore, botocore) is imported only if a tier of this store
    already imported it, so doctor on a local store never needs them.
    """
    if "mouthguard.tiers.s3" not in sys.modules:
        return None
    from mouthguard.tiers.s3 import S3Tier  # noqa: PLC0415 - already loaded, see above

    return tier.probe if isinstance(tier, S3Tier) else None


def _write_probe(tier: Tier, report: TierReport) -> None:
    """Create, re-create (must be refused), annotate and delete one small object."""
    key = f"{PROBE_PREFIX}/probe-{uuid.uuid4().hex}"
    try:
        tier.put(key, b"mouthguard doctor probe\n", mode=PutMode.CREATE)
    except MouthguardError as exc:
        report.problems.append(f"tier {tier.name} is not writable: {exc}")
        return
    try:
        try:
            tier.put(key, b"second create\n", mode=PutMode.CREATE)
            refused = False
        except ObjectExistsError:
            refused = True
        report.measured["conditional_put"] = refused
        if not refused and report.capabilities["conditional_put"]:
            report.problems.append(
                f"tier {tier.name} declares conditional put but accepted a second create-only put"
            )
        # The hint is advisory: a filesystem without user xattrs is a note, not a problem.
        report.hints_work = tier.annotate(key, {"doctor": "probe"}) and (
            tier.annotations(key).get("doctor") == "probe"
        )
    except MouthguardError as exc:
        report.problems.append(f"write probe on tier {tier.name} failed: {exc}")
    finally:
        try:
            tier.delete(key)
        except MouthguardError as exc:
            report.notes.append(f"probe object {key} not removed: {exc}")


def examine_tier(tier: Tier) -> TierReport:
    """Report one tier: declared and measured capabilities, hints, free space."""
    caps = dataclasses.asdict(tier.capabilities)
    report = TierReport(
        name=tier.name,
        kind=type(tier).__name__,
        location=tier.location(),
        domain=tier.domain,
        capabilities={name: bool(caps[name]) for name in _CAPABILITIES},
    )
    probe = _s3_probe(tier)
    if probe is not None:
        report.measured = {
            "conditional_put": probe.conditional_put,
            "object_lock": probe.object_lock,
        }
        report.create_guard = probe.create_guard.value
        report.hints = "object tags (mouthguard-importance)"
        report.notes.extend(
            [
                f"endpoint {probe.endpoint}, bucket {probe.bucket}",
                f"versioning {probe.versioning}",
                *probe.notes,
                f"probe took {probe.seconds:.2f} s",
            ]
        )
        if probe.default_retention:
            report.notes.append(f"default retention {probe.default_retention}")
        return report
    _write_probe(tier, report)
    if isinstance(tier, LocalTier):
        report.hints = "xattr user.mouthguard.*"
        if report.hints_work is False:
            report.notes.append("this filesystem does not keep user xattrs: no importance hints")
        try:
            usage = shutil.disk_usage(tier.root)
            report.device = tier.root.stat().st_dev
        except OSError as exc:  # the root vanished or became unreadable since it opened
            report.problems.append(f"tier {tier.name}: cannot stat {tier.root}: {exc.strerror}")
        else:
            report.free_bytes, report.total_bytes = usage.free, usage.total
    else:
        report.hints = "in the tier" if report.hints_work else "none"
    return report


def shared_devices(tiers: list[TierReport]) -> list[str]:
    """Warnings for local tiers in distinct failure domains on one filesystem."""
    return [
        f"tiers {a.name} ({a.domain}) and {b.name} ({b.domain}) are declared in distinct "
        "failure domains but share one filesystem: a disk failure loses both copies"
        for a, b in itertools.combinations(tiers, 2)
        if a.device is not None and a.device == b.device and a.domain != b.domain
    ]


def _placement_json(placement: Placement) -> dict[str, object]:
    return {
        "satisfiable": placement.satisfiable,
        "targets": list(placement.targets),
        "required_copies": placement.required_copies,
        "required_domains": placement.required_domains,
        "reasons": list(placement.reasons),
    }


def run(store: Store, args: argparse.Namespace, console: Console) -> int:
    """Examine every tier and each level's placement; exit 1 when any problem was found."""
    tiers = [examine_tier(t) for t in store.tiers]
    facts = tier_facts(store)
    # Most valuable first: that is the level an operator checks first.
    levels = sorted(Importance, key=lambda level: level.rank, reverse=True)
    placements = {level: placement_for(level, facts, store.policy) for level in levels}
    problems = [p for t in tiers for p in t.problems]
    for level, placement in placements.items():
        if not placement.satisfiable:
            # placement_for words what is missing as "unsatisfiable: ..." reasons.
            missing = [r for r in placement.reasons if r.startswith("unsatisfiable")]
            problems += [f"{level.value}: {r}" for r in missing or ["placement not satisfiable"]]
    # A checkpoint no tier holds intact is the failure this store exists to prevent.
    problems += [
        f"{item.run} step {item.step} is damaged on every tier: "
        + "; ".join(f"{c.tier}: {c.damage}" for c in item.copies if c.damage)
        for item in damaged_checkpoints(store)
    ]
    warnings = shared_devices(tiers)
    breaks, trails = check_store(store.tiers, trail_keys(store.manifest_keys))
    warnings += [f"audit trail: {b}" for b in breaks]
    latest = _latest(merged(trails))
    peers = peer_summary(args.peers) if getattr(args, "peers", None) else None
    if args.json:
        body = {
            "store": store.source,
            "ok": not problems,
            "problems": problems,
            "warnings": warnings,
            "tiers": [dataclasses.asdict(t) for t in tiers],
            "placement": {level.value: _placement_json(p) for level, p in placements.items()},
            "latest_acts": [
                {"run": run, "step": step, "acts": [act_json(a) for a in found]}
                for (run, step), found in latest
            ],
        }
        if peers is not None:
            body["peer_memory"] = peers
        print(json.dumps(body))
    else:
        _print(store.source, tiers, placements, (problems, warnings), console)
        if peers is not None:
            console.print(
                f"peer memory {escape(str(peers['path']))}: {peers['nodes']} node area(s), "
                f"{peers['steps']} step(s) held, {human_bytes(int(str(peers['bytes'])))}",
                highlight=False,
            )
        _print_acts(latest, console)
    return EXIT_FAILED if problems else EXIT_OK


def peer_summary(path: str) -> dict[str, object]:
    """The peer memory under ``path``: node areas, complete steps held (per node), bytes."""
    rows = peer_holdings(path, None)
    return {
        "path": path,
        "nodes": len(node_areas(path)),
        "steps": len(rows),
        "bytes": sum(int(str(r["bytes"])) for r in rows),
    }


#: Checkpoints whose latest acts doctor shows (the most recently touched), and acts each.
CHECKPOINTS_SHOWN = 20
ACTS_SHOWN = 3


def _latest(records: list[StoredRecord]) -> list[tuple[tuple[str, int], list[Act]]]:
    """The most recently touched checkpoints with their latest acts, newest first."""
    per = latest_acts(records, ACTS_SHOWN)
    ordered = sorted(per.items(), key=lambda kv: kv[1][0].intent.record.time, reverse=True)
    return ordered[:CHECKPOINTS_SHOWN]


def _print_acts(latest: list[tuple[tuple[str, int], list[Act]]], console: Console) -> None:
    if not latest:
        console.print("no acts recorded in the audit trail", highlight=False)
        return
    table = Table(title="latest acts per checkpoint (audit trail)", title_justify="left")
    for column in ("run", "step", "when", "act", "actor", "outcome", "reason"):
        table.add_column(column, justify="right" if column == "step" else "left")
    for (run, step), found in latest:
        for i, act in enumerate(found):
            r = act.intent.record
            table.add_row(
                escape(run) if i == 0 else "",
                str(step) if i == 0 else "",
                r.time[:19].replace("T", " "),
                r.act,
                escape(r.actor),
                escape(act.status),
                escape(r.reason),
            )
    console.print(table)


def _yes(value: bool | None) -> str:
    return {True: "[green]yes[/green]", False: "[red]no[/red]", None: "?"}[value]


def _capability_cell(t: TierReport) -> str:
    lines = []
    for name, value in t.capabilities.items():
        measured = t.measured.get(name)
        if measured is None:
            lines.append(f"{name} {_yes(value)}")
        elif measured == value:
            lines.append(f"{name} {_yes(value)} (measured)")
        else:  # S3: the server ignores If-None-Match, the tier guards CREATE itself
            lines.append(f"{name} {_yes(value)} (server: {_yes(measured)}, measured)")
    if t.create_guard is not None:
        lines.append(f"create-only via {escape(t.create_guard)}")
    return "\n".join(lines)


def _print(
    source: str,
    tiers: list[TierReport],
    placements: dict[Importance, Placement],
    findings: tuple[list[str], list[str]],
    console: Console,
) -> None:
    problems, warnings = findings
    table = Table(title=f"tiers of {escape(source)}", title_justify="left")
    for column in ("tier", "kind", "domain", "location", "capabilities", "hints", "free"):
        table.add_column(column, justify="right" if column == "free" else "left")
    for t in tiers:
        hints = t.hints if t.hints_work is None else f"{t.hints}: {_yes(t.hints_work)}"
        free = (
            "-"
            if t.free_bytes is None or t.total_bytes is None
            else f"{human_bytes(t.free_bytes)} of {human_bytes(t.total_bytes)}"
        )
        row = (escape(t.name), t.kind, escape(t.domain), escape(t.location))
        table.add_row(*row, _capability_cell(t), hints, free)
    console.print(table)
    for t in tiers:
        for note in t.notes:
            console.print(f"  {t.name}: {note}", highlight=False, markup=False)
    table = Table(title="placement by importance", title_justify="left")
    for column in ("level", "satisfiable", "targets", "reasons"):
        table.add_column(column)
    for level, placement in placements.items():
        table.add_row(
            level.value,
            _yes(placement.satisfiable),
            escape(", ".join(placement.targets) or "-"),
            escape("\n".join(placement.reasons)),
        )
    console.print(table)
    for line in warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)
    if problems:
        console.print("[red]not ready:[/red]", highlight=False)
        for line in problems:
            console.print(f"  {line}", highlight=False, markup=False)
    else:
        console.print("[green]ok: every importance level can be placed as the policy asks[/green]")
