"""``mouthguard data``: pack, index, verify and inspect datasets with a verified manifest.

::

    mouthguard data pack SRC DEST [--name N] [--shard-size BYTES] [--json]
    mouthguard data index SRC [--name N] [--kind webdataset|parquet] [--again] [--json]
    mouthguard data verify DATASET [--json]      # exit 1 naming every damaged shard
    mouthguard data ls DEST [--json]             # the datasets in DEST (or DEST itself)
    mouthguard data show DATASET [--json]        # one dataset and its shards or files

``index`` adopts a dataset the user already has -- the ``*.tar`` (WebDataset;
gzip-compressed ``*.tar.gz`` / ``*.tgz`` too) or ``*.parquet`` files under SRC,
left untouched -- by writing indexes and a
manifest beside them, in ``SRC/mouthguard-index/``; SRC is then a dataset like
any packed one (``verify SRC``, ``StreamingDataset(SRC)``). Parquet needs
pyarrow (``pip install 'mouthguard[parquet]'``).

DEST and DATASET are local directories or ``s3://bucket/prefix`` URLs (S3
settings from the environment, as every S3 tier reads them: ``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...). ``pack`` writes the dataset to
``DEST/NAME`` (NAME defaults to SRC's directory name) and shows its progress on
stderr, as ``index`` does; ``--json`` prints one object (``pack``, ``index``,
``show``) or JSON lines (``ls``, ``verify``: one per dataset or data file). With
``$MOUTHGUARD_MANIFEST_KEY`` set, ``pack`` and ``index`` sign the manifest and
the others require a valid signature.

Exit codes: 0 success; 1 a data file is damaged or unreachable, or an adopted
dataset's directory holds a data file its manifest does not list (``verify``), a
manifest is damaged or wrongly signed, or a source file cannot be packed or
indexed (a hostile tar, a file that is not Parquet); 2 usage errors (bad
arguments, no dataset at DATASET, no directory or no data files at SRC, both
kinds at SRC without ``--kind``, DEST/NAME already taken, SRC already indexed,
pyarrow missing for Parquet).

Torch is never imported; pyarrow only for Parquet.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from mouthguard.cli.common import (
    BYTE_SIZE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    print_error,
)
from mouthguard.data.dataset import Dataset, manifest_key, open_at, resolve_keys
from mouthguard.data.formats.manifest import PARQUET
from mouthguard.data.indexing.adopt import index_dataset
from mouthguard.data.location import locate
from mouthguard.data.verify import ShardCheck, verify_dataset
from mouthguard.data.writing.pack import pack, source_bytes
from mouthguard.data.writing.writer import DEFAULT_SHARD_SIZE
from mouthguard.errors import (
    DatasetExistsError,
    DatasetNotFoundError,
    MissingDependencyError,
    MouthguardError,
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``data`` and its subcommands on the ``mouthguard`` subparsers."""
    parser = sub.add_parser(
        "data",
        help="pack, index, verify and inspect datasets (WebDataset shards, Parquet)",
        description="Datasets with a verified manifest: WebDataset tar shards packed by "
        "mouthguard, or a user's own tars or Parquet files indexed in place.",
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
    pack_cmd.add_argument(
        "--lowercase-extensions",
        action="store_true",
        help="pack x.JPG as member jpg (WebDataset lowercases extensions on read)",
    )
    pack_cmd.add_argument("--json", action="store_true", help="print one JSON object")

    index = commands.add_parser(
        "index",
        help="adopt an existing dataset in place: index its *.tar (.tar.gz, .tgz) or *.parquet",
        description="Write indexes and a verified manifest beside the *.tar, *.tar.gz, *.tgz "
        "(WebDataset) or "
        "*.parquet files under SRC, in SRC/mouthguard-index/, leaving the files untouched.",
        epilog="exit status: 0 indexed; 1 a file cannot be indexed (named: a hostile tar, "
        "not Parquet); 2 usage error (SRC is no directory, already indexed without --again, "
        "holds no data files of the kind or both kinds without --kind, or Parquet without "
        "pyarrow)",
    )
    index.add_argument("src", help=f"the dataset's files: {where}")
    index.add_argument("--name", help="the dataset's name (default: SRC's last part)")
    index.add_argument(
        "--kind",
        choices=("webdataset", "parquet"),
        help="which files to index (default: whichever SRC holds)",
    )
    index.add_argument(
        "--again",
        action="store_true",
        help="index SRC again (files added or changed): replaces SRC/mouthguard-index/, "
        "never the data files",
    )
    index.add_argument("--json", action="store_true", help="print one JSON object")

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
    handlers = {"pack": _pack, "index": _index, "verify": _verify, "ls": _ls, "show": _show}
    try:
        return handlers[args.data_command](args, console, err)
    except DatasetNotFoundError as exc:
        target = getattr(args, "dataset", None)
        print_error(str(exc) + (_inside(target, args.data_command) if target else ""))
        return EXIT_USAGE
    except (DatasetExistsError, MissingDependencyError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except MouthguardError as exc:
        print_error(str(exc))
        return EXIT_FAILED


def _inside(dest: str, command: str) -> str:
    """For a path that is no dataset: the datasets directly under it, named, or ""."""
    try:
        location = locate(dest)
        children = [
            child
            for child in location.tier.list_dirs(f"{location.prefix}/" if location.prefix else "")
            if manifest_key(location.child(child)) is not None
        ]
    except MouthguardError:
        return ""  # the error already said what is wrong with the path
    if not children:
        return ""
    shown = ", ".join(sorted(children)[:10]) + (", ..." if len(children) > 10 else "")
    first = dest.rstrip("/") + "/" + sorted(children)[0]
    return (
        f"; it holds {len(children)} dataset(s): {shown} "
        f"(name one: mouthguard data {command} {first})"
    )


def summary(dataset: Dataset) -> dict[str, object]:
    """What a dataset holds, as one JSON-able object."""
    m = dataset.manifest
    info: dict[str, object] = {
        "name": m.name,
        "location": dataset.location.describe(),
        "kind": m.kind,
        "layout": m.layout,
        "created": m.created.isoformat(),
        "samples": m.samples,
    }
    if m.kind == PARQUET:
        info["files"] = len(m.files)
        info["row_groups"] = len(m.counts)
    else:
        info["shards"] = len(m.shards)
    info["bytes"] = m.nbytes
    if m.kind == PARQUET:
        info["columns"] = list(m.columns)
    else:
        info["extensions"] = list(m.extensions)
    info.update(
        fingerprint=m.fingerprint, signed=m.signed, signature_verified=m.signature_key is not None
    )
    return info


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # not reached


def _pack(args: argparse.Namespace, console: Console, err: Console) -> int:
    src = Path(args.src)
    name = args.name or src.resolve().name
    lowercase = args.lowercase_extensions
    # Walks and checks the whole tree first: a refused file is named before any bar is drawn.
    total = source_bytes(src, lowercase_extensions=lowercase) if src.is_dir() else 0
    # Drawn at the first sample packed: a missing SRC or a DEST/NAME already taken
    # is reported alone, not under an empty bar.
    with _LazyBar("packing", err, transient=args.json, total=total) as bar:
        manifest = pack(
            src,
            args.dest,
            name,
            shard_size=args.shard_size,
            progress=bar.update,
            lowercase_extensions=lowercase,
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


class _LazyBar:
    """A progress bar drawn at its first update.

    So an error found before any byte is read (a bad path, an indexed folder, no
    data files) prints alone, not under an empty bar.
    """

    def __init__(
        self, label: str, console: Console, *, transient: bool, total: int | None = None
    ) -> None:
        columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        self._bar = Progress(*columns, console=console, transient=transient)
        self._task: TaskID | None = None
        self._total = total

    def update(self, done: int) -> None:
        """Show ``done`` bytes (drawing the bar the first time)."""
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("work", total=self._total)
        self._bar.update(self._task, completed=done)

    def __enter__(self) -> _LazyBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._bar.stop()


def _index(args: argparse.Namespace, console: Console, err: Console) -> int:
    with _LazyBar("indexing", err, transient=args.json) as bar:
        manifest = index_dataset(
            args.src, name=args.name, kind=args.kind, progress=bar.update, again=args.again
        )
    dataset = open_at(locate(args.src), resolve_keys(None))
    if args.json:
        print(json.dumps(summary(dataset)))
        return EXIT_OK
    files = len(manifest.files) if manifest.kind == PARQUET else len(manifest.shards)
    units = f", {len(manifest.counts)} row groups" if manifest.kind == PARQUET else ""
    rows = "rows" if manifest.kind == PARQUET else "samples"
    console.print(
        f"indexed {manifest.samples} {rows} in {files} {manifest.kind} "
        f"file{'' if files == 1 else 's'}{units} "
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
    again = f"mouthguard data index --again {args.dataset}"
    why = f"not in the manifest: the loader does not read it (to include it: {again})"
    for path in report.unlisted:
        if args.json:
            print(json.dumps({"shard": path, "status": "unlisted", "reason": why}))
        else:
            console.print(
                f"[red]UNLISTED[/red] {escape(path)}: {why}", highlight=False, soft_wrap=True
            )
    if not args.json:
        bad = [*report.mismatched, *report.unreachable]
        names = [c.name for c in bad] + list(report.unlisted)
        verdict = (
            "[green]valid[/green]"
            if report.ok
            else f"[red]INVALID[/red] ({len(report.mismatched)} damaged, "
            f"{len(report.unreachable)} unreachable, {len(report.unlisted)} unlisted: "
            f"{escape(', '.join(names))})"
        )
        what = "files" if report.dataset.manifest.kind == PARQUET else "shards"
        console.print(
            f"{escape(report.dataset.name)}: {verdict}, {len(report.shards)} {what}, "
            f"{report.dataset.samples} samples, {report.dataset.fingerprint}",
            highlight=False,
            soft_wrap=True,
        )
        if report.mismatched and report.dataset.manifest.adopted:
            console.print(
                f"if those files were changed on purpose, index them again: {escape(again)}",
                highlight=False,
                soft_wrap=True,
            )
    return EXIT_OK if report.ok else EXIT_FAILED


def _datasets(dest: str) -> list[Dataset | tuple[str, str]]:
    """Datasets directly under ``dest`` (or ``dest`` itself); unreadable ones as (name, why)."""
    keys = resolve_keys(None)
    location = locate(dest)
    if manifest_key(location) is not None:
        return [open_at(location, keys)]
    found: list[Dataset | tuple[str, str]] = []
    for child in location.tier.list_dirs(f"{location.prefix}/" if location.prefix else ""):
        place = location.child(child)
        if manifest_key(place) is None:
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
    for column in ("name", "kind", "samples", "files", "size", "created", "fingerprint", "signed"):
        table.add_column(column, justify="right" if column in ("samples", "files") else "left")
    for item in found:
        if isinstance(item, Dataset):
            m = item.manifest
            table.add_row(
                escape(m.name),
                m.kind + (" (indexed)" if m.adopted else ""),
                str(m.samples),
                str(len(m.shards) + len(m.files)),
                _human(m.nbytes),
                m.created.astimezone().strftime("%Y-%m-%d %H:%M"),
                m.fingerprint[:23],
                "verified" if m.signature_key else ("yes" if m.signed else "no"),
            )
        else:
            table.add_row(escape(item[0]), "?", "?", "?", "?", "?", "[red]damaged[/red]", "?")
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
    files = [
        {"name": f.name, "rows": f.rows, "row_groups": len(f.row_groups), "bytes": f.size}
        | {"sha256": f.sha256}
        for f in dataset.files
    ]
    if args.json:
        listing = {"file_list": files} if files else {"shard_list": shards}
        print(json.dumps({**info, **listing}))
        return EXIT_OK
    for key, value in info.items():
        text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        console.print(f"{key:>18}: {escape(text)}", highlight=False, soft_wrap=True)
    parquet = dataset.manifest.kind == PARQUET
    table = Table(title="files" if parquet else "shards", title_justify="left")
    heads = ("file", "rows", "row groups") if parquet else ("shard", "samples")
    for column in (*heads, "size", "sha256"):
        table.add_column(
            column, justify="left" if column in ("file", "shard", "sha256") else "right"
        )
    for s in dataset.shards:
        table.add_row(escape(s.name), str(s.samples), _human(s.size), s.sha256[:16])
    for f in dataset.files:
        table.add_row(
            escape(f.name), str(f.rows), str(len(f.row_groups)), _human(f.size), f.sha256[:16]
        )
    console.print(table)
    return EXIT_OK
