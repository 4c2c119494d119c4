"""Pointer files: the small file left at the path a trainer asked to save to.

The checkpoint itself lives in the store. The trainer still looks at its
checkpoint directory (Lightning's ``ckpt_path="last"`` lists it for
``last*.ckpt`` and compares modification times; ``ModelCheckpoint`` checks
whether a name is taken), so a file must exist there. It says where the
checkpoint is::

    {"mouthguard_pointer": 1, "run": "my-run", "step": 42}

It is written atomically (a temporary file in the same directory, fsynced,
renamed over the target, the directory fsynced) and read as hostile input
(size cap, strict JSON, every field checked): a torch checkpoint or any other
file at the path is refused with an error saying what it is not.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mouthguard.checkpoint.surface import validate_run, validate_step
from mouthguard.errors import CheckpointNotFoundError, FormatError, MouthguardError
from mouthguard.format.strict_json import StrictJsonError, parse
from mouthguard.integrations.dir_files import fsync_dir

#: A pointer is a few dozen bytes; anything much larger is some other file.
MAX_POINTER_BYTES = 4096
_VERSION = 1


@dataclass(frozen=True)
class Pointer:
    """Which checkpoint of which run a trainer's path refers to."""

    run: str
    step: int


def write_pointer(path: str | os.PathLike[str], pointer: Pointer) -> None:
    """Write ``pointer`` at ``path`` atomically, creating its directory if needed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"mouthguard_pointer": _VERSION, "run": pointer.run, "step": pointer.step})
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body.encode() + b"\n")
            out.flush()
            os.fsync(out.fileno())
        Path(temp).replace(target)
        fsync_dir(target.parent)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_pointer(path: str | os.PathLike[str]) -> Pointer:
    """The pointer at ``path``.

    Raises:
        CheckpointNotFoundError: nothing is at ``path``.
        FormatError: the file at ``path`` is not a mouthguard pointer.
    """
    where = Path(path)
    try:
        with where.open("rb") as file:
            data = file.read(MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"no checkpoint at {where}") from None
    except OSError as exc:
        raise MouthguardError(f"cannot read {where}: {exc}") from exc
    not_ours = (
        f"{where} is not a mouthguard checkpoint pointer (a checkpoint written without "
        "mouthguard? load it with the trainer's default checkpoint I/O)"
    )
    if len(data) > MAX_POINTER_BYTES:
        raise FormatError(not_ours)
    try:
        body = parse(data, max_depth=2, source=str(where))
    except StrictJsonError as exc:
        raise FormatError(f"{not_ours}: {exc}") from None
    if not isinstance(body, dict) or body.get("mouthguard_pointer") != _VERSION:
        raise FormatError(not_ours)
    run, step = body.get("run"), body.get("step")
    if not isinstance(run, str) or type(step) is not int:
        raise FormatError(f"{where}: pointer without a valid run and step: {body}")
    try:
        return Pointer(validate_run(run), validate_step(step))
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}") from None


def remove_pointer(path: str | os.PathLike[str]) -> bool:
    """Remove the pointer at ``path``; return whether there was one."""
    try:
        Path(path).unlink()
    except FileNotFoundError:
        return False
    return True
