"""Which shard files read in place have hashed right: one record, shared by processes.

A local dataset read without a cache is verified where it lies: no sample of a
shard is read before the whole file hashed to the manifest's sha256. DataLoader
workers are new processes every epoch and each of them opens every shard of its
rank (the batches interleave), so a record kept in one process's memory would
hash each shard once per worker per epoch -- the dataset K times over with K
workers. :class:`VerifiedFiles` keeps the record in a directory that every
process of one :class:`~mouthguard.data.stream.StreamingDataset` names::

    <dir>/<name>.ok      the file's stat key when its bytes last hashed right
    <dir>/<name>.lock    held while one process hashes it; the others wait, then trust

where ``<name>`` is derived from the file's path and the expected sha256, so two
datasets (or two versions) never share a record.

The trust is the cache's (:mod:`~mouthguard.data.cache`): with ``verify="stat"``
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

from mouthguard.data.cache import Verify, flocked, hash_fd, read_stamp, stat_key
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

    def check(self, fd: int, path: str, sha256: str, size: int, name: str) -> None:
        """Return once the open file ``fd`` (at ``path``) is known to hash to ``sha256``.

        Hashes it unless the record says it already did, unchanged since; with
        several processes asking at once, one hashes and the others wait for it.

        Raises:
            ShardDamagedError: its bytes do not match (names shard ``name``); the
                record of the file is removed.
        """
        if self.verify == "always":
            self._hash(fd, sha256, size, name)
            return
        tag = hashlib.sha256(f"{path}\0{sha256}".encode()).hexdigest()[:32]
        record = self.root / f"{tag}.ok"
        key = stat_key(fd)
        if read_stamp(record) == key:
            return
        with flocked(self.root / f"{tag}.lock"):
            if read_stamp(record) == key:  # hashed by another process while we waited
                return
            try:
                self._hash(fd, sha256, size, name)
            except ShardDamagedError:
                record.unlink(missing_ok=True)
                raise
            tmp = self.root / f"{tag}.ok.{uuid.uuid4().hex}"
            tmp.write_text(json.dumps(key))
            tmp.replace(record)

    @staticmethod
    def _hash(fd: int, sha256: str, size: int, name: str) -> None:
        if hash_fd(fd, size) != sha256:
            raise ShardDamagedError(f"shard {name}: sha256 does not match the manifest", shard=name)
