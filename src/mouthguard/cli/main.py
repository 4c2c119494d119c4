"""``mouthguard`` command line: inspect, verify, protect and demo checkpoint stores.

One module per command group: :mod:`~mouthguard.cli.listing` (ls, show),
:mod:`~mouthguard.cli.checking` (verify, scrub), :mod:`~mouthguard.cli.lifecycle`
(gc), :mod:`~mouthguard.cli.restore` (restore), :mod:`~mouthguard.cli.facts` (hold,
release, promote with its aliases demote and importance), :mod:`~mouthguard.cli.audit` (audit),
:mod:`~mouthguard.cli.replication` (replicate),
:mod:`~mouthguard.cli.agent`, :mod:`~mouthguard.cli.doctor`,
:mod:`~mouthguard.cli.demo`, :mod:`~mouthguard.cli.plan`,
:mod:`~mouthguard.cli.simulate`, :mod:`~mouthguard.cli.chaos`, :mod:`~mouthguard.cli.data`,
:mod:`~mouthguard.cli.weights` and :mod:`~mouthguard.cli.serve` (the web page and
metrics). This module
builds the parser and maps what a command raises to an exit code.

Exit codes (:mod:`mouthguard.cli.common`): 0 success; 1 a checkpoint copy or one
of its sidecars is invalid (``verify``), a copy is damaged (``scrub``), no intact
source exists (``restore``), not protected (``replicate``), a placement is
unsatisfiable (``doctor``), there is no such hold (``release``), the audit
trail is broken (``audit --check``), an invariant broke
under injected faults (``chaos``), or the demo did not reproduce the reference
run; 2 usage errors (bad arguments, unknown store, tier, run or step); 3 a
safety limit refused (``gc --apply`` past the blast-radius limit); 130
interrupted; 141 (128 + SIGPIPE) when the reader of the output went away
(``mouthguard ls --json | head -1``): the command stops quietly, as Unix tools do.
Bad data never produces a traceback: every :class:`MouthguardError` becomes a
one-line message, and so does every argument error (no usage dump: a pointer to
the command's ``--help``).

``--store`` may come before or after the command. Only commands that write may
create a store (``demo``); every other one says "no store at ..." rather than
turn a directory into one. Output that is not a terminal is not wrapped (rich
would assume 80 columns), and error messages are never wrapped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mouthguard.checkpoint.peer_memory import DEFAULT_PATH as DEFAULT_PEER_PATH
from mouthguard.checkpoint.store import open_store
from mouthguard.cli import (
    agent,
    audit,
    chaos,
    checking,
    data,
    doctor,
    facts,
    lifecycle,
    listing,
    plan,
    replication,
    restore,
    serve,
    simulate,
    weights,
)
from mouthguard.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    STEP,
    Handler,
    Parser,
    Version,
    print_error,
)
from mouthguard.cli.render import error_console, stdout_console
from mouthguard.errors import CheckpointNotFoundError, ConfigError, MouthguardError

DEFAULT_STORE = "./mouthguard-store"
#: Commands that need no store: --store after them is not offered.
_STORELESS = {"plan", "simulate", "data", "weights"}
_STORE_HELP = "store directory or mouthguard.toml"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    # Typed as the base class: the add_parser functions take any parser's subparsers.
    parser: argparse.ArgumentParser = Parser(
        prog="mouthguard", description="Importance-aware, verified checkpoint storage."
    )
    parser.add_argument("--version", action=Version)
    parser.add_argument(
        "--store",
        default=os.environ.get("MOUTHGUARD_STORE", DEFAULT_STORE),
        help=f"{_STORE_HELP} (default: $MOUTHGUARD_STORE, else ./mouthguard-store); "
        "also accepted after the command",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", help="list committed checkpoints")
    ls.add_argument("run", nargs="?", help="only this run")
    ls.add_argument("--json", action="store_true", help="print JSON lines, one per checkpoint")
    ls.add_argument(
        "--peers",
        nargs="?",
        const=DEFAULT_PEER_PATH,
        metavar="PATH",
        help="also list the steps held in peer memory under PATH, per node "
        f"(default {DEFAULT_PEER_PATH})",
    )

    show = sub.add_parser("show", help="show one checkpoint")
    show.add_argument("run", help="the run's name")
    show.add_argument("step", type=STEP, help="the checkpoint's step")
    show.add_argument("--json", action="store_true", help="print one JSON object")

    verify = sub.add_parser(
        "verify",
        help="read every byte and check every checksum",
        description="Read every copy of the checkpoints named (all by default) and check "
        "every checksum and sidecar.",
        epilog="exit status: 0 every copy is valid; 1 a copy or one of its sidecars is "
        "invalid; 2 usage error (unknown store, run or step)",
    )
    verify.add_argument("run", nargs="?", help="only this run (default: every run)")
    verify.add_argument("step", nargs="?", type=STEP, help="only this step of RUN")
    verify.add_argument("--json", action="store_true", help="print JSON lines, one per copy")

    lifecycle.add_parsers(sub)
    restore.add_parsers(sub)
    scrub = sub.add_parser("scrub", help="re-read copies now; exit 1 if any is damaged")
    scrub.add_argument(
        "--max-age-seconds",
        type=NON_NEGATIVE,
        default=0.0,
        help="skip copies verified less than this long ago (default 0: re-read all)",
    )
    scrub.add_argument(
        "--budget-bytes", type=NON_NEGATIVE_INT, default=None, help="stop after reading this much"
    )
    scrub.add_argument("--json", action="store_true", help="print JSON lines")

    facts.add_parsers(sub)
    replication.add_parser(sub)
    agent.add_parser(sub)
    doctor.add_parser(sub)
    audit.add_parser(sub)
    demo = sub.add_parser("demo", help="train, crash, corrupt, resume: watch a run survive")
    demo.add_argument("--json", action="store_true", help="print one JSON object at the end")
    plan.add_parser(sub)
    simulate.add_parser(sub)
    chaos.add_parser(sub)
    data.add_parser(sub)
    weights.add_parser(sub)
    serve.add_parser(sub)
    _store_after_command(sub)
    return parser


def _store_after_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Accept ``--store`` after the command too (``mouthguard ls --store S``).

    SUPPRESS as the default leaves the value given before the command (or its
    default) in place unless the option is given after it.
    """
    seen: set[int] = set()
    for name, command in sub.choices.items():
        if name in _STORELESS or id(command) in seen:  # aliases share one parser
            continue
        seen.add(id(command))
        command.add_argument("--store", default=argparse.SUPPRESS, help=_STORE_HELP)


#: Every command that needs a store (demo, plan and simulate are dispatched apart).
_HANDLERS: dict[str, Handler] = {
    "ls": listing.ls,
    "show": listing.show,
    "verify": checking.verify,
    "scrub": checking.scrub_command,
    **lifecycle.HANDLERS,
    **restore.HANDLERS,
    **facts.HANDLERS,
    **replication.HANDLERS,
    **agent.HANDLERS,
    "doctor": doctor.run,
    "chaos": chaos.run,
    **serve.HANDLERS,
    **audit.HANDLERS,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mouthguard`` command (exit codes: see the module docstring)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, so that a reader gone by now is handled below too
    except BrokenPipeError:
        # The reader of stdout went away (`mouthguard ls | head -1`): stop quietly.
        # stdout now points to /dev/null, so the interpreter's last flush cannot fail again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    console = stdout_console()
    try:
        if args.command == "demo":
            from mouthguard.cli.demo import run_demo  # noqa: PLC0415 - heavy, demo only

            return run_demo(Path(args.store), console, as_json=args.json)
        if args.command in _STORELESS:  # arithmetic, or datasets that name their own place
            runners = {"plan": plan.run, "simulate": simulate.run, "data": data.run}
            runner = runners.get(args.command, weights.run)
            return runner(args, console)
        store = open_store(args.store, create=False)
        return _HANDLERS[args.command](store, args, console)
    # A checkpoint or run that does not exist is a wrong argument, not bad data.
    # (UsageError is a ValueError.)
    except (ConfigError, ValueError, CheckpointNotFoundError) as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except MouthguardError as exc:
        print_error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        error_console().print("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
