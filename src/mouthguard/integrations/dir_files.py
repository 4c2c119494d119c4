"""A directory of files as checkpoint state, and back: byte for byte.

A trainer that writes its own checkpoint directory (the Hugging Face ``Trainer``'s
``checkpoint-N/``: ``model.safetensors``, ``optimizer.pt``, ``trainer_state.json``,
...) is stored without interpreting a single file: each file becomes one
``uint8`` tensor of its exact bytes, keyed by its path relative to the directory
(``/``-separated). So the whole directory is one verified rank file plus the
manifest, restored files are identical to the originals, and nothing the
trainer pickled is ever unpickled by mouthguard.

Relative paths are checked both ways: only regular files are read (a symlink
or special file is an error naming it), and a stored path must be a plain
relative path (no ``..``, no absolute path, no empty segment) before anything is
written for it -- a manifest may be hostile.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from mouthguard.errors import FormatError, MouthguardError
from mouthguard.pathsafety import check_relative_path


def read_dir(root: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every regular file under ``root`` as ``{relative path: uint8 tensor of its bytes}``.

    The tensors map the files (see :func:`_mapped`): read them before the files change.

    Raises:
        MouthguardError: ``root`` is not a directory, or holds a symlink or a
            special file (which could not be restored as it was).
    """
    base = Path(root)
    if not base.is_dir():
        raise MouthguardError(f"{base} is not a directory")
    files: dict[str, torch.Tensor] = {}
    for path in sorted(base.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        relative = path.relative_to(base).as_posix()
        if path.is_symlink() or not path.is_file():
            raise MouthguardError(f"{path}: only regular files can be stored, not links or devices")
        files[relative] = _mapped(path)
    return files


def _mapped(path: Path) -> torch.Tensor:
    """The file's bytes as a tensor backed by the page cache, not by a copy in memory.

    Copy-on-write (``mode="c"``): the tensor is writable, as torch wants, and a
    write would never reach the file. A checkpoint directory may hold gigabytes;
    the save's snapshot is then the only copy in memory.
    """
    if path.stat().st_size == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c"))


def check_relative(name: object) -> str:
    """``name`` if it is a safe relative ``/``-separated path, else :class:`FormatError`."""
    return check_relative_path(name, "stored file name", FormatError)


def write_dir(files: object, dest: str | os.PathLike[str]) -> Path:
    """Write ``files`` (as :func:`read_dir` returns them) to a new directory ``dest``.

    The files are written into a temporary sibling of ``dest``, fsynced, and the
    directory renamed to ``dest`` last: ``dest`` appears complete or not at all.

    Raises:
        FileExistsError: ``dest`` exists already (nothing is overwritten).
        FormatError: ``files`` is not a mapping of safe names to uint8 tensors.
    """
    target = Path(dest)
    if target.exists():
        raise FileExistsError(f"{target} exists already: restore into a new directory")
    if not isinstance(files, dict):
        raise FormatError(f"stored files are a {type(files).__name__}, not a dict")
    checked = {check_relative(name): _bytes_of(name, data) for name, data in files.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in checked.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        staging.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        for path in sorted(staging.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        staging.rmdir()
        raise
    return target


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (its entry is data of the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bytes_of(name: object, data: object) -> memoryview:
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise FormatError(f"stored file {name!r} is not a 1-D uint8 tensor")
    return data.contiguous().numpy().data.cast("B")
