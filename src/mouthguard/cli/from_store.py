"""``--from-store STORE --run RUN`` of ``plan`` and ``simulate``: the run's recorded saves.

Reads the manifest of every committed checkpoint of the run (through
:func:`~mouthguard.checkpoint.gathering.gather`, as ``ls`` does: any tier's
readable copy) and hands their save records to
:func:`~mouthguard.plan.measured.summarise`. The store is opened read-only
(``create=False``): planning never writes. The figures replace the options that
assume them, so giving both is refused rather than one silently winning.
"""

from __future__ import annotations

import argparse

from mouthguard.checkpoint import catalog
from mouthguard.checkpoint.gathering import gather, steps_of
from mouthguard.checkpoint.store import open_store
from mouthguard.cli.common import UsageError
from mouthguard.errors import ConfigError
from mouthguard.plan.measured import MeasuredRun, RecordedSave, summarise

__all__ = ["REPLACED", "add_options", "measured_run"]

#: Options whose figure ``--from-store`` measures instead (dest names).
REPLACED = ("checkpoint_seconds", "write_bandwidth", "stall_seconds")


def add_options(p: argparse.ArgumentParser) -> None:
    """Add ``--from-store`` and ``--run`` to a ``plan`` or ``simulate`` parser."""
    p.add_argument(
        "--from-store",
        metavar="STORE",
        help="take the save time and stall from RUN's recorded saves in STORE "
        "(a store directory or mouthguard.toml)",
    )
    p.add_argument("--run", metavar="RUN", help="the run whose saves --from-store reads")


def measured_run(args: argparse.Namespace) -> MeasuredRun | None:
    """The run's recorded saves, or None without ``--from-store``.

    Raises :class:`UsageError` for ``--run`` without ``--from-store`` (or the
    reverse), for an option it replaces given too, and (as a ValueError) for a
    missing store or a run with no timed save.
    """
    source, run = args.from_store, args.run
    if source is None:
        if run is not None:
            raise UsageError("--run names the run --from-store reads: give --from-store too")
        return None
    if run is None:
        raise UsageError("--from-store needs --run: the run whose saves to read")
    given = [name for name in REPLACED if getattr(args, name, None) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"--from-store measures what {flags} would assume: give one or the other")
    catalog.validate_run(run)
    try:
        store = open_store(source, create=False)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    saves: list[RecordedSave] = []
    checkpoints = 0
    for step in steps_of(store, run):
        view = gather(store, run, step)
        if view is None:  # no tier's manifest reads: nothing recorded to use
            continue
        checkpoints += 1
        m = view.manifest
        if m.save is not None:
            saves.append(
                RecordedSave(
                    step, m.save.mode, m.save.seconds, m.save.stall_seconds, m.nbytes, m.world_size
                )
            )
    return summarise(store.source, run, checkpoints, saves)
