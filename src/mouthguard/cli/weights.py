"""``mouthguard weights load``: model weights into memory or a GPU, timed and verified.

::

    mouthguard weights load SOURCE [--device cuda] [--run RUN [--step N]]
                                   [--tp-rank R --tp-size N --tp-rule 'PATTERN=DIM' ...]
                                   [--include PATTERN ...] [--file NAME ...]
                                   [--cache DIR] [--no-verify] [--no-gds] [--json]

SOURCE is a Hugging Face model directory (``model.safetensors.index.json`` and its
shards, or one ``model.safetensors``), a hub cache snapshot
(``models--org--name/snapshots/<rev>``, or ``models--org--name`` for ``refs/main``),
a checkpoint directory, a store with ``--run``, or an ``s3://bucket/prefix`` URL
(``--cache DIR`` keeps a node-local copy that later loads read, downloaded again
when the remote file's ETag changes). The time reported is the load's, after
torch is imported. The command loads the weights the way an inference server
would at start-up, shows each file's progress on stderr, and prints what was
loaded, how fast, and what was verified (``--json``: one object).

Exit codes: 0 loaded; 1 damaged bytes (a checksum mismatch, a malformed shard)
or a failing store; 2 usage errors (nothing loadable at SOURCE, a malformed
index, a tensor-parallel split that does not divide a tensor, a device this
machine does not have, GPUDirect Storage asked for where it cannot work).
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from mouthguard.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, integer, print_error
from mouthguard.cli.render import human_bytes
from mouthguard.errors import MouthguardError, WeightsError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``weights`` and its subcommand on the ``mouthguard`` subparsers."""
    parser = sub.add_parser(
        "weights",
        help="load model weights into memory or a GPU (inference cold start)",
        description="Model weights from storage into device memory at the disk's speed.",
    )
    commands = parser.add_subparsers(dest="weights_command", required=True, metavar="SUBCOMMAND")
    load = commands.add_parser(
        "load",
        help="load a model directory or checkpoint and report speed and verification",
        epilog="exit status: 0 loaded; 1 damaged bytes or a failing store; 2 usage error",
    )
    load.add_argument(
        "source",
        help="model dir, hub cache snapshot, checkpoint dir, store (with --run), s3:// URL",
    )
    load.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    load.add_argument("--run", help="load a checkpoint of this run of the store SOURCE")
    load.add_argument("--step", type=integer(0), help="that checkpoint's step (default: newest)")
    load.add_argument("--tp-rank", type=integer(0), default=0, help="tensor-parallel rank")
    load.add_argument("--tp-size", type=integer(1), default=1, help="tensor-parallel size")
    load.add_argument(
        "--tp-rule",
        action="append",
        default=[],
        metavar="PATTERN=DIM",
        help="split tensors matching PATTERN on DIM (repeatable; first match wins)",
    )
    load.add_argument("--include", action="append", metavar="PATTERN", help="tensors to load")
    load.add_argument("--file", action="append", metavar="NAME", help="files to load")
    load.add_argument("--cache", metavar="DIR", help="node-local copy of a remote source")
    load.add_argument("--no-verify", action="store_true", help="skip checksum verification")
    load.add_argument("--no-gds", action="store_true", help="never use GPUDirect Storage")
    load.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace, console: Console, err: Console | None = None) -> int:
    """Run ``mouthguard weights load`` (exit codes: see the module docstring)."""
    from mouthguard import weights  # noqa: PLC0415 - only this command needs it

    err = err if err is not None else Console(stderr=True, soft_wrap=True)
    try:
        rules = weights.parse_rules(args.tp_rule)
        parallel = weights.TensorParallel(args.tp_rank, args.tp_size, rules)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        ) as progress:
            task = progress.add_task("loading files", total=None)

            def done(name: str, nbytes: int) -> None:
                progress.update(task, advance=1, description=f"{name} ({human_bytes(nbytes)})")

            loaded = weights.load(
                args.source,
                args.device,
                run=args.run,
                step=args.step,
                verify=not args.no_verify,
                tensor_parallel=parallel if args.tp_size > 1 else None,
                include=args.include,
                files=args.file,
                cache_dir=args.cache,
                gds=False if args.no_gds else None,
                on_file=done,
            )
    except WeightsError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except MouthguardError as exc:
        print_error(str(exc))
        return EXIT_FAILED
    summary = {
        "source": loaded.source,
        "kind": loaded.kind,
        "device": loaded.device,
        "tensors": len(loaded.tensors),
        "bytes": loaded.nbytes,
        "bytes_read": loaded.bytes_read,
        "downloaded": loaded.downloaded,
        "refreshed_files": loaded.refreshed_files,
        "seconds": round(loaded.seconds, 6),
        "gib_per_s": round(loaded.bytes_per_second / 2**30, 3),
        "verified_files": loaded.verified_files,
        "unverified_files": loaded.unverified_files,
        "gds": loaded.gds,
        "gds_reason": loaded.gds_reason,
    }
    if args.json:
        console.print_json(json.dumps(summary))
        return EXIT_OK
    table = Table("", "", show_header=False, box=None)
    table.add_row("source", f"{loaded.source} ({loaded.kind})")
    table.add_row("device", loaded.device)
    table.add_row("tensors", f"{len(loaded.tensors)} ({human_bytes(loaded.nbytes)})")
    table.add_row(
        "read", f"{human_bytes(loaded.bytes_read)}, {human_bytes(loaded.downloaded)} downloaded"
    )
    if loaded.refreshed_files:
        changed = ", ".join(loaded.refreshed_files)
        table.add_row("refreshed", f"{changed} (changed on the remote since cached)")
    table.add_row("time", f"{loaded.seconds:.3f} s ({summary['gib_per_s']} GiB/s)")
    table.add_row("verified", ", ".join(loaded.verified_files) or "nothing (no checksums)")
    if loaded.unverified_files:
        table.add_row("unverified", ", ".join(loaded.unverified_files))
    table.add_row("GPUDirect", f"{'yes' if loaded.gds else 'no'}: {loaded.gds_reason}")
    console.print(table)
    return EXIT_OK
