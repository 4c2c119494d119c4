"""What every ``mouthguard`` command shares: exit codes, argument types, how errors are reported.

**Exit codes** (the same for every command; each command's ``--help`` or module
docstring says which of them it uses and when):

=====  =======================  ======================================================
code   name                     meaning
=====  =======================  ======================================================
0      :data:`EXIT_OK`          success
1      :data:`EXIT_FAILED`      the command ran, but what it checks or aims for does
                                not hold: a copy is invalid or damaged, a checkpoint
                                is left unprotected, there is no such hold, a
                                placement is unsatisfiable, an invariant broke under
                                chaos, the demo did not reproduce its reference run;
                                also bad data (any other ``MouthguardError``)
2      :data:`EXIT_USAGE`       usage error: bad arguments, or arguments that name
                                nothing (unknown store, tier, run, step, model), or
                                an option whose optional dependency is missing
3      :data:`EXIT_REFUSED`     a safety limit stopped the command before it acted:
                                ``gc --apply`` would have started deleting more of
                                a run than the blast-radius limit allows, or a
                                milestone (``--force`` overrides)
130    :data:`EXIT_INTERRUPTED` interrupted (128 + SIGINT)
141    :data:`EXIT_BROKEN_PIPE` the reader of the output went away (128 + SIGPIPE):
                                the command stops quietly, as Unix tools do
=====  =======================  ======================================================

**Errors** reach the user one way, :func:`print_error`: one line on stderr,
``error: MESSAGE``, never wrapped, never a traceback. An argument that argparse
rejects adds one more line, a pointer to the command's ``--help``
(:class:`Parser`), instead of the usage dump. An argument that parses but names
nothing raises :class:`UsageError`, which ``main`` reports and turns into exit 2.

**Argument types** raise :class:`argparse.ArgumentTypeError` with one wording,
so a bad value reads the same whatever the command::

    error: argument --rounds: must be an integer >= 1: '0'
    error: argument --interval: not a number: 'soon'

(a plain ``ValueError`` would make argparse print the function's Python name:
"invalid _rounds value").
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from rich.console import Console
from rich.markup import escape

from mouthguard.checkpoint.store import Store
from mouthguard.cli.render import error_console

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for a process stopped by SIGINT
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE

#: A subcommand that needs a store: ``(store, parsed arguments, stdout console) -> exit code``.
Handler = Callable[[Store, argparse.Namespace, Console], int]

_T = TypeVar("_T")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BYTE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BYTE_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})
_BYTE_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)
_SIZED = re.compile(r"\s*([0-9.eE+-]+)\s*([kmgtp]?)b?(?:/s)?\s*", re.IGNORECASE)


class UsageError(ValueError):
    """Arguments that parse but name nothing: a run, step, tier or model that is not there.

    ``main`` reports it with :func:`print_error` and exits :data:`EXIT_USAGE`.
    A ``ValueError`` so that validators below the CLI (run names, step numbers),
    which raise plain ``ValueError``, are reported the same way.
    """


def print_error(message: str, *, hint: str | None = None) -> None:
    """Report ``message`` on stderr as ``error: MESSAGE`` (red on a terminal), then ``hint``.

    The only way the CLI reports an error. The message is printed as text, never
    as rich markup: ``[policy]`` in a configuration error stays ``[policy]``.
    """
    console = error_console()
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    if hint is not None:
        console.print(hint, highlight=False, markup=False)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line plus a pointer to ``--help`` (exit 2).

    Subparsers inherit the class (``add_subparsers`` makes them with the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE`` and ``run 'PROG --help' for usage``; exit 2."""
        print_error(message, hint=f"run '{self.prog} --help' for usage")
        self.exit(EXIT_USAGE)


class Version(argparse.Action):
    """``--version``: print ``PROG VERSION`` (the installed distribution's) and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        """Print the version and exit (importlib.metadata costs 30 ms: only paid here)."""
        from importlib.metadata import version  # noqa: PLC0415 - see above

        del namespace, values, option_string  # argparse's signature; nothing to store
        print(f"{parser.prog} {version('mouthguard')}")
        parser.exit()


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A type accepting a decimal integer, within ``[minimum, maximum]`` where given."""

    def parse(text: str) -> int:
        bound = "" if minimum is None else f" >= {minimum}"
        if maximum is not None:
            bound += f"{' and' if bound else ''} <= {maximum}"
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer{bound}: {text!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be an integer{bound}: {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def number(
    low: float, high: float = math.inf, *, strict: bool = False, units: bool = False
) -> Callable[[str], float]:
    """A type accepting a finite number in ``[low, high]`` (``(low, high]`` if ``strict``).

    With ``units`` a decimal suffix K, M, G, T or P is allowed, optionally followed
    by ``B`` or ``B/s`` (``600G``, ``30.72TB``, ``25GB/s``).
    """

    def parse(text: str) -> float:
        match = _SIZED.fullmatch(text)
        bad = argparse.ArgumentTypeError(f"not a number: {text!r}")
        if match is None or (match.group(2) and not units):
            raise bad
        try:
            value = float(match.group(1)) * _UNITS[match.group(2).lower()]
        except ValueError:
            raise bad from None
        if math.isnan(value) or math.isinf(value):
            raise bad
        if not (low < value if strict else low <= value) or value > high:
            bound = f"{'>' if strict else '>='} {low:g}"
            bound += "" if high == math.inf else f" and <= {high:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}: {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def checked(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """``parse`` with its ValueError's message passed on as the argument error."""

    def wrapped(text: str) -> _T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = getattr(parse, "__name__", "value")
    return wrapped


#: An integer >= 1 (counts: rounds, passes, GPUs, runs).
COUNT = integer(1)
#: An integer >= 0 (steps, byte budgets).
NON_NEGATIVE_INT = integer(0)
#: A step number as a positional argument.
STEP = NON_NEGATIVE_INT
#: A number > 0 (intervals, hours, days).
POSITIVE = number(0, strict=True)
#: A number >= 0 (seconds that may be zero, prices).
NON_NEGATIVE = number(0)
#: A probability in [0, 1].
PROBABILITY = number(0, 1)
#: Bytes or bytes per second > 0, with an optional decimal suffix (600G, 30.72TB).
BYTES = number(0, strict=True, units=True)


def _byte_size(text: str) -> int:
    """``268435456``, ``256MiB`` (binary), ``250MB`` or ``250M`` (decimal) -> bytes (> 0)."""
    match = _BYTE_SIZE.fullmatch(text)
    if match is None or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a size in bytes > 0 (256MiB, 250MB, 268435456): {text!r}"
        )
    return int(match.group(1)) * _BYTE_UNITS[(match.group(2) or "").lower()]


#: A size in bytes, an integer > 0: ``268435456``, ``256MiB`` (binary) or ``250MB`` (decimal).
BYTE_SIZE = _byte_size


def failure_hours(text: str) -> tuple[float, ...]:
    """Failure times given as comma-separated hours >= 0 (``3,17.5``): seconds, sorted."""
    times = tuple(sorted(NON_NEGATIVE(part) * 3600.0 for part in text.split(",") if part.strip()))
    if not times:
        raise argparse.ArgumentTypeError("give at least one failure time, e.g. 3,17.5")
    return times


__all__ = [
    "BYTES",
    "COUNT",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "NON_NEGATIVE",
    "NON_NEGATIVE_INT",
    "POSITIVE",
    "PROBABILITY",
    "STEP",
    "Handler",
    "Parser",
    "UsageError",
    "Version",
    "checked",
    "failure_hours",
    "integer",
    "number",
    "print_error",
]
