"""``verify_dataset``: re-read every shard and index and check them against the manifest.

Per shard, in this order: the index (size, sha256, then parsed as hostile
input against the shard's size and sample count), the shard's size (a
truncated shard is damage, not a failed read), then every byte of the shard
through concurrent ranged reads, hashed in order, with every member's tar
header checked against the index as its bytes go by. So a shard passes only if
its bytes are the manifest's *and* a tar reader finds in it exactly the
samples the index lists.

Each shard gets one verdict:

* ``ok``;
* ``mismatch`` with the reason: the bytes are damaged or were changed (a
  missing object included);
* ``unreachable`` with the reason: the tier could not be read (an I/O error, a
  timeout, a dead endpoint). That proves nothing about the bytes and is never
  reported as damage.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from mouthguard.data import names, tarfmt
from mouthguard.data.dataset import Dataset, open_dataset
from mouthguard.data.index import ShardIndex
from mouthguard.data.location import Target
from mouthguard.data.manifest import ShardRecord
from mouthguard.data.ranged import DEFAULT_PARALLEL, DEFAULT_RANGE_SIZE, read_ranges
from mouthguard.errors import ObjectNotFoundError, ShardDamagedError, TierError, is_data_damage
from mouthguard.format.signing import KeySpec

Status = Literal["ok", "mismatch", "unreachable"]


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard (see the module docstring)."""

    name: str
    status: Status
    reason: str = ""
    samples: int = 0
    size: int = 0


@dataclass(frozen=True)
class VerifyReport:
    """Every shard's verdict, in manifest order."""

    dataset: Dataset
    shards: tuple[ShardCheck, ...]

    @property
    def ok(self) -> bool:
        """Whether every shard was read and matched."""
        return all(s.status == "ok" for s in self.shards)

    @property
    def mismatched(self) -> list[ShardCheck]:
        """Shards whose bytes are damaged or changed."""
        return [s for s in self.shards if s.status == "mismatch"]

    @property
    def unreachable(self) -> list[ShardCheck]:
        """Shards that could not be read (not damage)."""
        return [s for s in self.shards if s.status == "unreachable"]


def headers_by_offset(index: ShardIndex) -> dict[int, tuple[str, int]]:
    """Header offset -> (member name, data size) for every member of ``index``."""
    return {
        m.offset - tarfmt.BLOCK: (names.member_name(s.key, m.ext), m.size)
        for s in index.samples
        for m in s.members
    }


def check_shard_bytes(
    dataset: Dataset,
    shard: ShardRecord,
    index: ShardIndex,
    *,
    range_size: int = DEFAULT_RANGE_SIZE,
    parallel: int = DEFAULT_PARALLEL,
) -> None:
    """Read all of ``shard``; check its size, sha256 and every tar header against ``index``.

    Raises:
        ShardDamagedError: a mismatch (the message names the shard and what differs).
        TierError: the shard could not be read (ObjectNotFoundError: it is missing).
    """
    key = dataset.shard_key(shard)
    size = dataset.location.tier.head(key).size
    if size != shard.size:
        raise ShardDamagedError(
            f"shard {shard.name} is {size} bytes, the manifest says {shard.size}"
            + (" (truncated)" if size < shard.size else ""),
            shard=shard.name,
        )
    expected = headers_by_offset(index)
    digest = hashlib.sha256()
    for start, data in read_ranges(
        dataset.location.tier, key, size, shard=shard.name, range_size=range_size, parallel=parallel
    ):
        digest.update(data)
        # Ranges are whole 512-byte blocks, so every header lies inside one range.
        view = memoryview(data)
        for at in range(start, start + len(data), tarfmt.BLOCK):
            member = expected.get(at)
            if member is not None:
                block = view[at - start : at - start + tarfmt.BLOCK]
                problem = tarfmt.header_problem(block, *member)
                if problem is not None:
                    raise ShardDamagedError(
                        f"shard {shard.name}: at byte {at}: {problem}", shard=shard.name
                    )
    if digest.hexdigest() != shard.sha256:
        raise ShardDamagedError(
            f"shard {shard.name}: sha256 does not match the manifest", shard=shard.name
        )


def verify_shard(dataset: Dataset, shard: ShardRecord, **read: int) -> ShardCheck:
    """The verdict on one shard (never raises for damage or an unreachable tier)."""
    try:
        index = dataset.read_index(shard)
        check_shard_bytes(dataset, shard, index, **read)
    except ObjectNotFoundError:
        return ShardCheck(shard.name, "mismatch", f"shard {shard.name} is missing")
    except (ShardDamagedError, TierError) as exc:
        status: Status = "mismatch" if is_data_damage(exc) else "unreachable"
        return ShardCheck(shard.name, status, str(exc))
    return ShardCheck(shard.name, "ok", samples=shard.samples, size=shard.size)


def verify_dataset(
    source: Target | Dataset,
    *,
    prefix: str = "",
    signing_key: KeySpec | None = None,
    workers: int = 2,
    on_shard: Callable[[ShardCheck], None] | None = None,
) -> VerifyReport:
    """Re-read every shard and index of a dataset against its manifest.

    Args:
        source: an opened :class:`Dataset`, or where one is (see :func:`open_dataset`).
        prefix: the dataset's key prefix inside ``source``.
        signing_key: manifest keys; default ``$MOUTHGUARD_MANIFEST_KEY`` (with a key,
            an unsigned or wrongly signed manifest raises before any shard is read).
        workers: shards verified at once (each with its own concurrent ranged reads).
        on_shard: called with each verdict as it is reached (progress), in any order.

    Returns:
        The verdicts in manifest order.

    Raises:
        DatasetNotFoundError: nothing is committed there.
        ManifestError: the manifest itself is damaged, hostile or wrongly signed.
    """
    dataset = (
        source
        if isinstance(source, Dataset)
        else open_dataset(source, prefix=prefix, signing_key=signing_key)
    )

    def one(shard: ShardRecord) -> ShardCheck:
        check = verify_shard(dataset, shard)
        if on_shard is not None:
            on_shard(check)
        return check

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify") as pool:
        checks = tuple(pool.map(one, dataset.shards))
    return VerifyReport(dataset, checks)
