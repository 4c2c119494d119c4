"""Which shard files read in place have hashed right: one record, shared by processes.

A local dataset read without a cache is verified where it lies: no sample of a
shard is read before the whole file hashed to the manifest's sha256. DataLoader
workers are new processes every epoch and each of them opens every shard of its
rank (the batches interleave), so a record kept in one process's memory would
hash each shard once per worker per epoch -- the dataset K times over with K
workers. :class:`VerifiedFiles` keeps the record in a directory that every
process of one :class:`~mouthguard.data.loading.stream.StreamingDataset` names::

    <dir>/<name>.ok      the file's stat key when its bytes last hashed right
    <dir>/<name>.lock    held while one process hashes it; the others wait, then trust

where ``<name>`` is derived from the file's path, the part's offset and its
expected sha256 (a part is a whole shard, or a verified byte range of a file such
as a Parquet row group), so two datasets or versions never share a record.

The trust is the cache's (:mod:`~mouthguard.data.fetching.cache`): with ``verify="stat"``
a file whose ``(device, inode, size, mtime_ns, ctime_ns)`` is what it was when
it hashed right is not hashed again. Any change made through the filesystem
(a write, a truncate, ``touch``, a replaced file) changes ``ctime`` and forces a
full re-hash; silent media corruption does not, so ``verify="always"`` hashes
on every open (no record is consulted). The directory must be private to the
training user, like a cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

from mouthguard.data.fetching.cache import Verify
from mouthguard.data.fetching.cachefiles import flocked, hash_range, read_stamp, stat_key
from mouthguard.data.formats.part import Part
from mouthguard.errors import ShardDamagedError


class VerifiedFiles:
    """The shared record of in-place files that matched the manifest.

    Args:
        directory: the record's directory (created if missing).
        verify: ``stat`` trusts an unchanged file hashed before by any process
            naming ``directory``; ``always`` hashes on every open.
    """

    def __init__(self, directory: str | os.PathLike[str], verify: Verify) -> None:
        if verify not in ("stat", "always"):
            raise ValueError(f"verify_cache must be 'stat' or 'always', not {verify!r}")
        self.root = Path(directory)
        self.verify = verify
        self.root.mkdir(parents=True, exist_ok=True)

    def check(self, fd: int, path: str, part: Part) -> None:
        """Return once bytes ``part`` of the open file ``fd`` (at ``path``) match the manifest.

        The file must have the manifest's size and the part's bytes its sha256.
        Hashes them unless the record says it already did, the file unchanged
        since; with several processes asking at once, one hashes and the others
        wait for it, then trust its record.

        Raises:
            ShardDamagedError: they do not match (names the data file); the record
                of the part is removed.
        """
        if self.verify == "always":
            _hash(fd, part)
            return
        tag = hashlib.sha256(f"{path}\0{part.offset}\0{part.sha256}".encode()).hexdigest()[:32]
        record = self.root / f"{tag}.ok"
        key = stat_key(fd)
        if read_stamp(record) == key:
            return
        with flocked(self.root / f"{tag}.lock"):
            if read_stamp(record) == key:  # hashed by another process while we waited
                return
            try:
                _hash(fd, part)
            except ShardDamagedError:
                record.unlink(missing_ok=True)
                raise
            tmp = self.root / f"{tag}.ok.{uuid.uuid4().hex}"
            tmp.write_text(json.dumps(key))
            tmp.replace(record)


def _hash(fd: int, part: Part) -> None:
    if (
        os.fstat(fd).st_size != part.file_size
        or hash_range(fd, part.offset, part.size) != part.sha256
    ):
        raise ShardDamagedError(
            f"{part.name}: {part.what} sha256 does not match the manifest", shard=part.name
        )
