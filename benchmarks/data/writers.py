"""Every format, written from the same samples, locally; and the copies on S3.

Each peer writes with its own writer: one file per sample, webdataset's
``ShardWriter`` (its ``TarWriter``), mosaicml-streaming's ``MDSWriter``,
litdata's ``optimize``; mouthguard packs the raw files' directory with
``mouthguard.data.pack``. Shards are cut at the same size for every format.
On S3, the peers' local files are uploaded as they are (boto3) and mouthguard
packs the raw files straight into the bucket (its own S3 writer); the raw files
become one object per sample. Run in a child process: litdata's ``optimize``
switches the process's multiprocessing start method to ``spawn``.
"""

from __future__ import annotations

import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.data import config, samples
from benchmarks.data.config import PAYLOAD, Site

MIB = 1024 * 1024


def mosaic_workaround() -> None:
    """Import ``streaming`` without its vision subpackage (see the report's notes).

    ``streaming/__init__`` imports ``streaming.vision``, which imports torchvision;
    torchvision's PyPI wheel is built against CUDA torch and fails against the CPU
    torch here ("operator torchvision::nms does not exist"). The benchmark never
    uses the vision datasets, so an empty module stands in for them.
    """
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


def write(reader: str, root: Path, count: int, size: int, shard_size: int) -> None:
    """Write ``reader``'s local copy of the dataset under ``root``."""
    dest = config.dataset_dir(root, reader)
    dest.parent.mkdir(parents=True, exist_ok=True)
    WRITERS[reader](dest, count, size, shard_size)


def _raw(dest: Path, count: int, size: int, shard_size: int) -> None:
    del shard_size
    dest.mkdir()
    for k, data in samples.samples(count, size):
        (dest / f"{k}.{PAYLOAD}").write_bytes(data)


def _webdataset(dest: Path, count: int, size: int, shard_size: int) -> None:
    import webdataset as wds  # type: ignore[import-untyped]  # noqa: PLC0415 - a peer

    dest.mkdir()
    pattern = str(dest / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=shard_size, maxcount=10**9, verbose=0) as sink:
        for k, data in samples.samples(count, size):
            sink.write({"__key__": k, PAYLOAD: data})


def _mosaic(dest: Path, count: int, size: int, shard_size: int) -> None:
    mosaic_workaround()
    from streaming import MDSWriter  # noqa: PLC0415

    columns = {"key": "str", PAYLOAD: "bytes"}
    with MDSWriter(out=str(dest), columns=columns, size_limit=shard_size) as sink:
        for k, data in samples.samples(count, size):
            sink.write({"key": k, PAYLOAD: data})


def _litdata_item(i: int, size: int) -> dict[str, Any]:
    return {"key": samples.key(i), PAYLOAD: samples.payload(i, size)}


def _litdata(dest: Path, count: int, size: int, shard_size: int) -> None:
    import functools  # noqa: PLC0415

    import litdata  # type: ignore[import-untyped]  # noqa: PLC0415

    litdata.optimize(
        fn=functools.partial(_litdata_item, size=size),
        inputs=list(range(count)),
        output_dir=str(dest),
        chunk_bytes=shard_size,
        num_workers=1,
        reorder_files=False,
        mode="overwrite",
        verbose=False,
    )


def _mouthguard(dest: Path, count: int, size: int, shard_size: int) -> None:
    from mouthguard.data import pack  # noqa: PLC0415

    raw = config.dataset_dir(dest.parent.parent, "raw")
    if not raw.is_dir():  # pack reads the raw files: write them first if missing
        _raw(raw, count, size, shard_size)
    pack(raw, dest.parent, dest.name, shard_size=shard_size)


WRITERS = {
    "raw": _raw,
    "webdataset": _webdataset,
    "mosaic": _mosaic,
    "litdata": _litdata,
    "mouthguard": _mouthguard,
}


def s3_client() -> Any:
    """A boto3 client for the benchmark's server (settings from ``AWS_*``)."""
    import boto3  # noqa: PLC0415
    from botocore.config import Config  # noqa: PLC0415

    return boto3.client(
        "s3",
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=16,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


def upload(reader: str, root: Path, site: Site, shard_size: int) -> None:
    """Put ``reader``'s copy in the bucket under :func:`config.s3_prefix`."""
    prefix = config.s3_prefix(reader)
    local = config.dataset_dir(root, reader)
    if reader == config.MOUTHGUARD:
        from mouthguard.data import pack  # noqa: PLC0415

        raw = config.dataset_dir(root, "raw")
        pack(raw, f"s3://{site.bucket}/{prefix}", "bench", shard_size=shard_size)
        return
    client = s3_client()
    files = sorted(p for p in local.rglob("*") if p.is_file())

    def put(path: Path) -> None:
        client.upload_file(str(path), site.bucket, f"{prefix}/{path.relative_to(local)}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(put, files))


def delete_prefix(site: Site, prefix: str) -> int:
    """Delete every object under ``prefix/`` (frees the server's memory); return the count."""
    client = s3_client()
    deleted = 0
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=site.bucket, Prefix=f"{prefix}/"
    ):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=site.bucket, Delete={"Objects": keys, "Quiet": True})
            deleted += len(keys)
    return deleted


def tree_bytes(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)
