"""``pack``: a directory tree of small files -> a dataset of large verified shards.

Millions of small objects saturate any metadata server; a few hundred large
shards do not. ``pack`` groups files the way WebDataset does: ``train/x.jpg``
and ``train/x.json`` are the members ``jpg`` and ``json`` of the sample with key
``train/x`` (the key is the path up to the first dot of the file name).

Order is deterministic: samples in lexicographic order of their keys (code
points, the whole tree as one sorted list), members by extension, so the same
tree always gives byte-identical shards. The walk holds one directory listing
at a time, never the whole tree.

Nothing is lost silently: a file without an extension, a key or extension
WebDataset would read back differently, a symbolic link to a directory or any
other non-regular entry fails the pack with :class:`~mouthguard.errors.SampleError`
naming the path, and nothing is committed. Names starting with a dot (``.DS_Store``,
``.cache/``) are skipped, as hidden files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from mouthguard.data.location import Target
from mouthguard.data.manifest import DatasetManifest
from mouthguard.data.writer import DEFAULT_SHARD_SIZE, ShardWriter
from mouthguard.errors import SampleError
from mouthguard.format.signing import KeySpec

#: ``(key, [(ext, path), ...])``: one sample's files, members sorted by extension.
Group = tuple[str, list[tuple[str, Path]]]


def _listing(directory: Path) -> tuple[dict[str, list[tuple[str, Path]]], list[str]]:
    groups: dict[str, list[tuple[str, Path]]] = {}
    dirs: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            elif entry.is_file():
                base, dot, ext = entry.name.partition(".")
                if not dot or not ext:
                    raise SampleError(f"{path}: no extension, so it cannot be a sample member")
                groups.setdefault(base, []).append((ext, path))
            else:
                raise SampleError(f"{path}: not a regular file or directory (refused, not skipped)")
    return groups, dirs


def iter_groups(root: Path, rel: str = "") -> Iterator[Group]:
    """Every sample under ``root`` in key order (see the module docstring)."""
    groups, dirs = _listing(root / rel if rel else root)
    # A directory sorts as "name/": exactly where its keys fall among the files' keys.
    order = sorted([(key, False) for key in groups] + [(d + "/", True) for d in dirs])
    for name, is_dir in order:
        if is_dir:
            yield from iter_groups(root, rel + name)
        else:
            yield rel + name, sorted(groups[name])


def source_bytes(src_dir: str | os.PathLike[str]) -> int:
    """Bytes of every file ``pack`` would read under ``src_dir`` (for a progress total)."""
    root = Path(src_dir)
    return sum(path.stat().st_size for _, files in iter_groups(root) for _, path in files)


def pack(
    src_dir: str | os.PathLike[str],
    dest: Target,
    name: str,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    prefix: str = "",
    signing_key: KeySpec | None = None,
    progress: Callable[[int], None] | None = None,
) -> DatasetManifest:
    """Pack the files under ``src_dir`` into the dataset ``dest/name``; return its manifest.

    Args:
        src_dir: the directory tree to pack.
        dest: a local directory, an ``s3://bucket/prefix`` URL, or a tier.
        name: the dataset's name (a single path segment).
        shard_size: target shard size in bytes.
        prefix: a key prefix inside ``dest``.
        signing_key: manifest keys (default ``$MOUTHGUARD_MANIFEST_KEY``).
        progress: called with the bytes read so far after each sample.

    Raises:
        SampleError: a file cannot become a sample member (the message names it).
        DatasetExistsError: ``dest/name`` already holds a dataset or its debris.
    """
    root = Path(src_dir)
    if not root.is_dir():
        raise SampleError(f"{root} is not a directory")
    done = 0
    with ShardWriter(
        dest, name, shard_size=shard_size, prefix=prefix, signing_key=signing_key
    ) as writer:
        for key, files in iter_groups(root):
            sample: dict[str, object] = {"__key__": key}
            for ext, path in files:
                data = path.read_bytes()
                sample[ext] = data
                done += len(data)
            try:
                writer.write(sample)
            except SampleError as exc:
                raise SampleError(f"{root / key}.*: {exc}") from None
            if progress is not None:
                progress(done)
    assert writer.manifest is not None  # the with block committed
    return writer.manifest
