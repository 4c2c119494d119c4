"""DCP ``checkpoint_id`` strings: ``<run>/<step>`` names one checkpoint, ``<run>`` a run."""

from __future__ import annotations

import os

from mouthguard.checkpoint import catalog


def parse_checkpoint_id(checkpoint_id: str | os.PathLike[str]) -> tuple[str, int | None]:
    """Split ``<run>/<step>`` (step in decimal, zero padding allowed) or ``<run>``.

    Raises:
        ValueError: the id is neither form, or the run or step is invalid.
    """
    text = os.fspath(checkpoint_id)
    run, sep, step_text = text.partition("/")
    run = catalog.validate_run(run)
    if not sep:
        return run, None
    if not step_text.isdecimal() or not step_text.isascii():
        raise ValueError(f"invalid checkpoint_id {text!r}: expected '<run>/<step>'")
    step = int(step_text)
    catalog.validate_step(step)
    return run, step
