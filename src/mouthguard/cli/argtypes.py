"""Argument types and the parser class of the ``mouthguard`` command line.

Every type raises :class:`argparse.ArgumentTypeError` with one wording, so a bad
value reads the same whatever the command::

    error: argument --rounds: must be an integer >= 1: '0'
    error: argument --interval: not a number: 'soon'

(a plain ``ValueError`` would make argparse print the function's Python name:
"invalid _rounds value"). :class:`Parser` prints that one line and a hint naming
the command's ``--help`` instead of the full usage, and exits 2.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

_T = TypeVar("_T")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_SIZED = re.compile(r"\s*([0-9.eE+-]+)\s*([kmgtp]?)b?(?:/s)?\s*", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line plus a pointer to ``--help`` (exit 2).

    Subparsers inherit the class (``add_subparsers`` makes them with the parent's type).
    """

    def error(self, message: str) -> NoReturn:
        """Print ``error: MESSAGE`` and ``run 'PROG --help' for usage``; exit 2."""
        self.exit(2, f"error: {message}\nrun '{self.prog} --help' for usage\n")


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


def integer(minimum: int | None = None) -> Callable[[str], int]:
    """A type accepting a decimal integer, ``>= minimum`` when one is given."""

    def parse(text: str) -> int:
        bound = "" if minimum is None else f" >= {minimum}"
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer{bound}: {text!r}") from None
        if minimum is not None and value < minimum:
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


__all__ = [
    "BYTES",
    "COUNT",
    "NON_NEGATIVE",
    "NON_NEGATIVE_INT",
    "POSITIVE",
    "PROBABILITY",
    "STEP",
    "Parser",
    "Version",
    "checked",
    "integer",
    "number",
]
