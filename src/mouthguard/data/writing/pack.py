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
naming the path, and nothing is committed. Uppercase extensions (``IMG_0001.JPG``,
as cameras write them) are such a case, since WebDataset lowercases what it
reads; ``lowercase_extensions=True`` packs them lowercased instead, and refuses
two files of one sample that would then collide (``x.JPG`` beside ``x.jpg``).
Names starting with a dot (``.DS_Store``, ``.cache/``) are skipped, as hidden
files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from mouthguard.data.formats import names
from mouthguard.data.formats.manifest import DatasetManifest
from mouthguard.data.location import Target
from mouthguard.data.writing.writer import DEFAULT_SHARD_SIZE, ShardWriter
from mouthguard.errors import SampleError
from mouthguard.format.signing import KeySpec

#: ``(key, [(ext, path), ...])``: one sample's files, members sorted by extension.
Group = tuple[str, list[tuple[str, Path]]]


def _listing(
    directory: Path, lowercase: bool
) -> tuple[dict[str, list[tuple[str, Path]]], list[str]]:
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
                if lowercase:
                    ext = ext.lower()
                members = groups.setdefault(base, [])
                clash = next((other for name, other in members if name == ext), None)
                if clash is not None:
                    raise SampleError(f"{path} and {clash} are both member {ext!r} of one sample")
                members.append((ext, path))
            else:
                raise SampleError(f"{path}: not a regular file or directory (refused, not skipped)")
    return groups, dirs


def iter_groups(root: Path, rel: str = "", *, lowercase: bool = False) -> Iterator[Group]:
    """Every sample under ``root`` in key order (see the module docstring).

    ``lowercase``: lowercase the extensions (see the module docstring).
    """
    groups, dirs = _listing(root / rel if rel else root, lowercase)
    # A directory sorts as "name/": exactly where its keys fall among the files' keys.
    order = sorted([(key, False) for key in groups] + [(d + "/", True) for d in dirs])
    for name, is_dir in order:
        if is_dir:
            yield from iter_groups(root, rel + name, lowercase=lowercase)
        else:
            yield rel + name, sorted(groups[name])


def source_bytes(src_dir: str | os.PathLike[str], *, lowercase_extensions: bool = False) -> int:
    """Bytes of every file ``pack`` would read under ``src_dir`` (for a progress total).

    Walks the tree as ``pack`` does and checks every key and extension as the
    shard writer will, so a tree ``pack`` would refuse fails here, before any
    progress bar is drawn or any shard written.

    Raises:
        SampleError: as :func:`pack` would (the message names the file).
    """
    root = Path(src_dir)
    total = 0
    for key, files in iter_groups(root, lowercase=lowercase_extensions):
        try:
            names.check_key(key)
            for ext, path in files:
                names.check_ext(ext, key)
                total += path.stat().st_size
        except SampleError as exc:
            raise _named(root, key, files, exc) from None
    return total


def _named(root: Path, key: str, files: list[tuple[str, Path]], exc: SampleError) -> SampleError:
    """``exc`` naming the sample's files, with the way out for uppercase extensions."""
    hint = ""
    if any(ext != ext.lower() for ext, _ in files):
        hint = " (pass --lowercase-extensions, or lowercase_extensions=True, to pack it lowercased)"
    return SampleError(f"{root / key}.*: {exc}{hint}")


def pack(
    src_dir: str | os.PathLike[str],
    dest: Target,
    name: str,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    prefix: str = "",
    signing_key: KeySpec | None = None,
    progress: Callable[[int], None] | None = None,
    lowercase_extensions: bool = False,
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
        lowercase_extensions: pack ``x.JPG`` as member ``jpg`` (see the module docstring).

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
        for key, files in iter_groups(root, lowercase=lowercase_extensions):
            sample: dict[str, object] = {"__key__": key}
            for ext, path in files:
                data = path.read_bytes()
                sample[ext] = data
                done += len(data)
            try:
                writer.write(sample)
            except SampleError as exc:
                raise _named(root, key, files, exc) from None
            if progress is not None:
                progress(done)
    assert writer.manifest is not None  # the with block committed
    return writer.manifest
