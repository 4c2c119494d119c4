"""Shared rendering helpers for the CLI (consoles, sizes, durations, progress)."""

from __future__ import annotations

import datetime as dt
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress

#: The width of output that is not a terminal (a pipe, a file, a test's capture) unless
#: $COLUMNS says otherwise: rich would otherwise assume 80 columns, cut tables and
#: break lines in two. Tables still take only the width their content needs.
UNWRAPPED_WIDTH = 10_000


class _Console(Console):
    """A console that leaves a closed pipe to ``main``, as ``print`` does.

    rich's own handling exits 1 at once; ``main`` ends with the status of SIGPIPE
    (141) whichever way the output was written.
    """

    def on_broken_pipe(self) -> None:
        """Stop writing and raise the BrokenPipeError for ``main`` to handle."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")


def stdout_console() -> Console:
    """The console of a command's output: the terminal's width, or unwrapped when piped."""
    return _unwrapped_off_terminal(_Console())


def error_console() -> Console:
    """The console of error messages: never wrapped, so an error stays one line."""
    return _unwrapped_off_terminal(_Console(stderr=True, soft_wrap=True))


def _unwrapped_off_terminal(console: Console) -> Console:
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = UNWRAPPED_WIDTH
    return console


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_time(when: dt.datetime) -> str:
    """A compact local timestamp."""
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")


@contextmanager
def progress(console: Console, *, show: bool) -> Iterator[Progress]:
    """A transient rich progress display, shown only on a terminal."""
    with Progress(console=console, transient=True, disable=not show) as progress:
        yield progress
