"""``mouthguard data``: pack, verify and inspect datasets of verified WebDataset shards.

::

    mouthguard data pack SRC DEST [--name N] [--shard-size BYTES] [--json]
    mouthguard data verify DATASET [--json]      # exit 1 naming every damaged shard
    mouthguard data ls DEST [--json]             # the datasets in DEST (or DEST itself)
    mouthguard data show DATASET [--json]        # one dataset and its shards

DEST and DATASET are local directories or ``s3://bucket/prefix`` URLs (S3
settings from the environment, as every S3 tier reads them: ``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...). ``pack`` writes the dataset to
``DEST/NAME`` (NAME defaults to SRC's directory name) and shows its progress on
stderr; ``--json`` prints one object (``pack``, ``show``) or JSON lines (``ls``,
``verify``: one per dataset or shard). With ``$MOUTHGUARD_MANIFEST_KEY`` set,
``pack`` signs the manifest and the others require a valid signature.

Exit codes: 0 success; 1 a shard is damaged or unreachable (``verify``), a
manifest is damaged or wrongly signed, or a source file cannot be packed; 2 usage
errors (bad arguments, no dataset at DATASET, DEST/NAME already taken).

Torch is never imported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from mouthguard.cli.common import (
    BYTE_SIZE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    print_error,
)
from mouthguard.data import names
from mouthguard.data.dataset import Dataset, open_at, resolve_keys
from mouthguard.data.location import locate
from mouthguard.data.pack import pack, source_bytes
from mouthguard.data.verify import ShardCheck, verify_dataset
from mouthguard.data.writer import DEFAULT_SHARD_SIZE
from mouthguard.errors import DatasetExistsError, DatasetNotFoundError, MouthguardError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``data`` and its subcommands on the ``mouthguard`` subparsers."""
    parser = sub.add_parser(
        "data",
        help="pack, verify and inspect datasets (verified WebDataset shards)",
        description="Datasets of WebDataset tar shards with a verified manifest.",
    )
    commands = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    where = "a local directory or s3://bucket/prefix"

    pack_cmd = commands.add_parser("pack", help="pack a directory of small files into shards")
    pack_cmd.add_argument("src", help="the directory tree to pack (x.jpg + x.json -> sample x)")
    pack_cmd.add_argument("dest", help=f"where the dataset goes: {where}")
    pack_cmd.add_argument("--name", help="the dataset's name (default: SRC's directory name)")
    pack_cmd.add_argument(
        "--shard-size",
        type=BYTE_SIZE,
        default=DEFAULT_SHARD_SIZE,
        help="target shard size (default 256MiB; 1GiB, 500MB, or bytes)",
    )
    pack_cmd.add_argument("--json", action="store_true", help="print one JSON object")

    verify = commands.add_parser(
        "verify",
        help="re-read every shard and index against the manifest",
        epilog="exit status: 0 every shard matches; 1 a shard is damaged or unreachable "
        "(named); 2 usage error (no dataset there)",
    )
    verify.add_argument("dataset", help=f"the dataset: {where}")
    verify.add_argument("--json", action="store_true", help="print JSON lines, one per shard")

    ls = commands.add_parser("ls", help="list the datasets in a directory or prefix")
    ls.add_argument("dest", help=f"{where} holding datasets (or a dataset itself)")
    ls.add_argument("--json", action="store_true", help="print JSON lines, one per dataset")

    show = commands.add_parser("show", help="show one dataset and its shards")
    show.add_argument("dataset", help=f"the dataset: {where}")
    show.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace, console: Console, err: Console | None = None) -> int:
    """Run ``mouthguard data SUBCOMMAND`` (exit codes: see the module docstring)."""
    err = err if err is not None else Console(stderr=True, soft_wrap=True)
    handlers = {"pack": _pack, "verify": _verify, "ls": _ls, "show": _show}
    try:
        return handlers[args.data_command](args, console, err)
    except (DatasetNotFoundError, DatasetExistsError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except MouthguardError as exc:
        print_error(str(exc))
        return EXIT_FAILED


def summary(dataset: Dataset) -> dict[str, object]:
    """What a dataset holds, as one JSON-able object."""
    m = dataset.manifest
    return {
        "name": m.name,
        "location": dataset.location.describe(),
        "kind": m.kind,
        "created": m.created.isoformat(),
        "samples": m.samples,
        "shards": len(m.shards),
        "bytes": m.nbytes,
        "extensions": list(m.extensions),
        "fingerprint": m.fingerprint,
        "signed": m.signed,
        "signature_verified": m.signature_key is not None,
    }


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # not reached


def _pack(args: argparse.Namespace, console: Console, err: Console) -> int:
    src = Path(args.src)
    name = args.name or src.resolve().name
    total = source_bytes(src) if src.is_dir() else 0
    columns = (TextColumn("packing"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=args.json) as bar:
        task = bar.add_task("pack", total=total)
        manifest = pack(
            src,
            args.dest,
            name,
            shard_size=args.shard_size,
            progress=lambda done: bar.update(task, completed=done),
        )
    dataset = open_at(locate(args.dest).child(name), resolve_keys(None))
    if args.json:
        print(json.dumps(summary(dataset)))
        return EXIT_OK
    console.print(
        f"packed {manifest.samples} samples into {len(manifest.shards)} shards "
        f"({_human(manifest.nbytes)}) at {escape(dataset.location.describe())}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"fingerprint {manifest.fingerprint}", highlight=False, soft_wrap=True)
    return EXIT_OK


def _verify(args: argparse.Namespace, console: Console, err: Console) -> int:
    del err  # verdicts go to stdout, damage included: that is the command's output

    def line(check: ShardCheck) -> None:
        if args.json:
            print(json.dumps({"shard": check.name, "status": check.status, "reason": check.reason}))
            return
        mark = {"ok": "[green]ok[/green]", "mismatch": "[red]MISMATCH[/red]"}.get(
            check.status, "[yellow]UNREACHABLE[/yellow]"
        )
        why = f": {escape(check.reason)}" if check.reason else ""
        console.print(f"{mark} {escape(check.name)}{why}", highlight=False, soft_wrap=True)

    report = verify_dataset(args.dataset, on_shard=line, workers=2)
    if not args.json:
        bad = [*report.mismatched, *report.unreachable]
        verdict = (
            "[green]valid[/green]"
            if report.ok
            else f"[red]INVALID[/red] ({len(report.mismatched)} damaged, "
            f"{len(report.unreachable)} unreachable: {', '.join(c.name for c in bad)})"
        )
        console.print(
            f"{escape(report.dataset.name)}: {verdict}, {len(report.shards)} shards, "
            f"{report.dataset.samples} samples, {report.dataset.fingerprint}",
            highlight=False,
            soft_wrap=True,
        )
    return EXIT_OK if report.ok else EXIT_FAILED


def _datasets(dest: str) -> list[Dataset | tuple[str, str]]:
    """Datasets directly under ``dest`` (or ``dest`` itself); unreadable ones as (name, why)."""
    keys = resolve_keys(None)
    location = locate(dest)
    if location.tier.exists(location.key(names.MANIFEST_NAME)):
        return [open_at(location, keys)]
    found: list[Dataset | tuple[str, str]] = []
    for child in location.tier.list_dirs(f"{location.prefix}/" if location.prefix else ""):
        place = location.child(child)
        if not place.tier.exists(place.key(names.MANIFEST_NAME)):
            continue  # not a dataset (or an uncommitted one: invisible)
        try:
            found.append(open_at(place, keys))
        except MouthguardError as exc:
            found.append((child, str(exc)))
    return found


def _ls(args: argparse.Namespace, console: Console, err: Console) -> int:
    del err
    found = _datasets(args.dest)
    if args.json:
        for item in found:
            entry = summary(item) if isinstance(item, Dataset) else {"name": item[0]}
            if not isinstance(item, Dataset):
                entry["damaged"] = item[1]
            print(json.dumps(entry))
        return EXIT_OK
    if not found:
        console.print(f"no datasets in {escape(args.dest)}", highlight=False, soft_wrap=True)
        return EXIT_OK
    table = Table(title=f"datasets in {escape(args.dest)}", title_justify="left")
    for column in ("name", "samples", "shards", "size", "created", "fingerprint", "signed"):
        table.add_column(column, justify="right" if column in ("samples", "shards") else "left")
    for item in found:
        if isinstance(item, Dataset):
            m = item.manifest
            table.add_row(
                escape(m.name),
                str(m.samples),
                str(len(m.shards)),
                _human(m.nbytes),
                m.created.astimezone().strftime("%Y-%m-%d %H:%M"),
                m.fingerprint[:23],
                "verified" if m.signature_key else ("yes" if m.signed else "no"),
            )
        else:
            table.add_row(escape(item[0]), "?", "?", "?", "?", "[red]damaged[/red]", "?")
    console.print(table)
    for item in found:
        if not isinstance(item, Dataset):
            console.print(
                f"[red]damaged:[/red] {escape(item[0])} -- {escape(item[1])}",
                highlight=False,
                soft_wrap=True,
            )
    return EXIT_OK


def _show(args: argparse.Namespace, console: Console, err: Console) -> int:
    del err
    dataset = open_at(locate(args.dataset), resolve_keys(None))
    info = summary(dataset)
    shards = [
        {"name": s.name, "samples": s.samples, "bytes": s.size, "sha256": s.sha256}
        for s in dataset.shards
    ]
    if args.json:
        print(json.dumps({**info, "shard_list": shards}))
        return EXIT_OK
    for key, value in info.items():
        text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        console.print(f"{key:>18}: {escape(text)}", highlight=False, soft_wrap=True)
    table = Table(title="shards", title_justify="left")
    for column in ("shard", "samples", "size", "sha256"):
        table.add_column(column, justify="right" if column in ("samples", "size") else "left")
    for s in dataset.shards:
        table.add_row(s.name, str(s.samples), _human(s.size), s.sha256[:16])
    console.print(table)
    return EXIT_OK
