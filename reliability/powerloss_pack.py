"""The power-loss harness's ``pack`` variant: ``data pack``'s commit under a power cut.

:func:`record_pack` packs a small tree of files into a dataset of several
shards under the recorded directory (the source tree lies outside it, so only
the dataset's writes are recorded). :func:`check_pack_state` judges one crash
state: the dataset is either not committed at all (``DatasetNotFoundError``: a
reader sees nothing) or committed whole, every sample byte-exact -- and once
the pack returned (acknowledged), it must be there. A committed manifest that
vouches for missing or torn shards fails the state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mouthguard.data.loading.stream import StreamingDataset
from mouthguard.data.writing.pack import pack
from mouthguard.errors import DatasetNotFoundError, MouthguardError
from reliability.crashstates import CrashState, Log
from reliability.fsrecord import Recorder

#: The mark a pack recording starts with.
MARK = "pack"
NAME = "packed"
#: Samples, and bytes per member: several shards of about 10 KiB.
SAMPLES = 24
MEMBER_BYTES = 1000


def expected() -> dict[str, dict[str, bytes]]:
    """Every sample packed: key -> member -> bytes (a pure function of the key)."""
    return {
        f"s{i:03d}": {
            "bin": bytes((i * 7 + j) % 251 for j in range(MEMBER_BYTES)),
            "txt": f"sample {i}".encode(),
        }
        for i in range(SAMPLES)
    }


def record_pack(store_dir: Path, log: Path) -> None:
    """Pack :func:`expected` into ``store_dir/<NAME>``, recording into ``log``."""
    source = log.parent / "pack-source"
    source.mkdir()
    for key, members in expected().items():
        for ext, data in members.items():
            (source / f"{key}.{ext}").write_bytes(data)
    with Recorder(store_dir, log) as rec:
        rec.mark(ev=MARK)
        pack(source, store_dir, NAME, shard_size=10 * 1024)
        rec.mark(ev="acked", step=0)


def check_pack_state(directory: Path, log: Log, state: CrashState) -> list[str]:
    """The failures of one crash state of a pack recording (empty: it survived)."""
    acked = any(m["ev"] == "acked" for m in log.marks_before(state.k))
    try:
        stream = StreamingDataset(directory / NAME)
        got: dict[str, dict[str, Any]] = {}
        for sample in stream:
            key = str(sample["__key__"])
            got[key] = {k: v for k, v in sample.items() if not k.startswith("__")}
    except DatasetNotFoundError:
        return ["(c) the acknowledged pack is gone"] if acked else []
    except MouthguardError as exc:
        return [f"(b) a committed dataset does not read back: {exc}"]
    if got != expected():
        return ["(b) the committed dataset reads back other samples or bytes"]
    return []
