"""Datasets users already have, written by other tools: WebDataset tars and Parquet files.

The tars come from the ``webdataset`` library's own ``TarWriter`` (long keys,
so GNU or PAX extended headers; its own user, group, mode and mtime) plus one
written with ``tarfile`` directly, holding what real tars hold besides samples:
a directory entry, a metadata member WebDataset skips, a symbolic link, a PAX
record of its own, ``./`` names. The Parquet files come from pyarrow: several
files, several row groups each, mixed column types with strings, lists and
nulls. Every row has a unique ``id``, so "each row exactly once" is checkable.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

#: Longer than a USTAR name field (100 bytes): only GNU or PAX tars can hold it.
LONG = "deep/" * 30


def wds_tars(root: Path, shards: int = 3, per: int = 7, fmt: str = "PAX_FORMAT") -> list[Path]:
    """``shards`` tars of ``per`` samples under ``root/train``, by webdataset's ``TarWriter``."""
    import webdataset as wds  # noqa: PLC0415 - a test dependency, loaded where used

    paths = []
    for s in range(shards):
        path = root / "train" / f"part-{s:03d}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        with wds.TarWriter(
            str(path), user="alice", group="staff", mode=0o640, mtime=1.7e9, format=fmt
        ) as writer:
            for i in range(per):
                writer.write(
                    {
                        "__key__": f"{LONG}s{s}_{i:04d}",
                        "jpg": bytes([i % 256]) * ((i * 311 + s) % 3000),
                        "json": {"i": i, "shard": s},
                        "cls": i % 3,
                        "seg.png": b"",
                    }
                )
        paths.append(path)
    return paths


def _add(tar: tarfile.TarFile, name: str, data: bytes, **extra: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for field, value in extra.items():
        setattr(info, field, value)
    tar.addfile(info, io.BytesIO(data))


def odd_tar(path: Path) -> Path:
    """A tar with what user tars hold besides samples (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        directory = tarfile.TarInfo("./d")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        _add(tar, "__index__", b'{"made by": "hand"}')  # metadata: WebDataset skips it
        _add(tar, "./d/a.txt", b"first", pax_headers={"comment": "a record of its own"})
        _add(tar, "./d/a.JSON", b"{}", uname="bob", mtime=12345)  # extension lowercased
        link = tarfile.TarInfo("./d/link.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.txt"
        tar.addfile(link)  # not a regular file: skipped, and it does not split a sample
        _add(tar, "./d/" + "b" * 200 + ".txt", b"long")
        _add(tar, "./d/README", b"no extension: skipped")
        _add(tar, "./d/c.txt", b"")
    return path


def strip_wds(sample: dict[str, Any]) -> dict[str, Any]:
    """A webdataset sample without what it adds besides key and members."""
    return {k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")}


def webdataset_samples(paths: list[Path]) -> list[dict[str, Any]]:
    """What ``webdataset.WebDataset`` yields from ``paths``, in order."""
    import webdataset as wds  # noqa: PLC0415

    dataset = wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False)
    return [strip_wds(s) for s in dataset]


def parquet_files(
    root: Path, files: int = 3, rows: int = 230, group: int = 60, start: int = 0
) -> tuple[list[Path], int]:
    """``files`` Parquet files under ``root/data`` with row groups of ``group`` rows.

    Returns the paths and the number of rows; row ``n`` has ``id`` ``start + n``.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    paths = []
    n = start
    for f in range(files):
        count = rows + 17 * f  # files of different sizes, last row groups short
        ids = list(range(n, n + count))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "text": [None if i % 7 == 0 else f"doc {i} " + "é" * (i % 5) for i in ids],
                "tokens": [[i, i + 1][: i % 3] for i in ids],
                "score": [None if i % 11 == 0 else i / 4 for i in ids],
                "flag": [i % 2 == 0 for i in ids],
                "meta": [{"source": f"f{f}", "n": i} for i in ids],
            }
        )
        path = root / "data" / f"train-{f:05d}-of-{files:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=group)
        paths.append(path)
        n += count
    return paths, n - start


def parquet_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """Every row of ``paths``, in file order, as pyarrow reads them whole."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    rows: list[dict[str, Any]] = []
    for path in paths:
        rows += pq.read_table(path).to_pylist()
    return rows


def gzipped(paths: list[Path], suffix: str = ".tar.gz") -> list[Path]:
    """Each tar of ``paths`` gzip-compressed as ``x.tar.gz`` (or ``x.tgz``), the tar removed."""
    import gzip  # noqa: PLC0415

    out = []
    for path in paths:
        data = path.read_bytes()
        target = path.with_name(path.name.removesuffix(".tar") + suffix)
        target.write_bytes(gzip.compress(data, mtime=0))
        path.unlink()
        out.append(target)
    return out
