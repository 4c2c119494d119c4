"""What one measurement is: the readers, where their data lives, a cell and its result.

A *cell* is one reader on one source with one number of DataLoader workers, run
in a fresh process (:mod:`benchmarks.data.child`): a cold epoch, then a warm one.
Everything crossing the process boundary is plain JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Every reader, in table order: the floor, the baseline, the peers, then mouthguard
#: (read in place, then through a local cache directory).
READERS = ("memory", "raw", "webdataset", "mosaic", "litdata", "mouthguard", "mouthguard-cache")
MOUTHGUARD = "mouthguard"
#: The rows that are mouthguard's (judged against the best peer).
MOUTHGUARDS = ("mouthguard", "mouthguard-cache")
#: Rows that are no peer: the floor (no I/O at all).
REFERENCE = ("memory",)
#: Readers only measured on the local source (the floor reads nothing; on S3 mouthguard
#: always has a cache directory).
LOCAL_ONLY = ("memory", "mouthguard-cache")
SOURCES = ("local", "s3")
#: Row labels of the report.
LABELS = {
    "memory": "in-memory samples, no I/O (the DataLoader's own cost)",
    "raw": "raw small files (one file per sample, open/read)",
    "webdataset": "webdataset (its TarWriter shards)",
    "mosaic": "mosaicml-streaming (MDS, StreamingDataset)",
    "litdata": "litdata (optimize, StreamingDataset)",
    "mouthguard": "mouthguard (pack, StreamingDataLoader)",
    "mouthguard-cache": "mouthguard with a local cache_dir",
}
#: Sample members every format stores: the key and one payload.
PAYLOAD = "bin"
#: The S3 bucket the benchmark creates on its own server.
BUCKET = "mouthguard-bench-data"
#: webdataset's sample shuffle buffer (its documented ``.shuffle(1000)``).
WDS_SHUFFLE = 1000


def dataset_dir(root: Path, reader: str) -> Path:
    """Where ``reader``'s local copy of the dataset is written (mouthguard's is shared)."""
    return root / "datasets" / ("mouthguard" if reader in MOUTHGUARDS else reader)


def cache_dir(root: Path, reader: str, source: str) -> Path:
    """The loader's own local cache for ``source`` (emptied before every cold epoch)."""
    return root / "cache" / f"{reader}-{source}"


def s3_prefix(reader: str) -> str:
    """The key prefix of ``reader``'s copy in the bucket."""
    return reader


@dataclass(frozen=True)
class Site:
    """The S3 server a cell reads from (credentials travel in the environment)."""

    endpoint: str
    bucket: str
    log: str  # the RGW log, whose access lines count the requests


@dataclass(frozen=True)
class Cell:
    """One measurement: ``reader`` over ``source`` with ``workers`` DataLoader workers.

    ``mode``: ``throughput`` (epochs as fast as they go) or ``stall`` (a simulated
    training step of ``step_s`` seconds after each batch). ``persistent``: every
    reader's DataLoader is built with ``persistent_workers=True`` (with workers),
    so the warm epoch reuses the cold epoch's worker processes.
    """

    reader: str
    source: str
    workers: int
    mode: str
    root: str
    samples: int
    sample_size: int
    batch_size: int
    step_s: float
    count_opens: bool
    site: Site | None = None
    epochs: int = 2
    persistent: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Cell:
        raw = json.loads(text)
        site = raw.pop("site")
        return Cell(**raw, site=Site(**site) if site else None)


@dataclass
class Epoch:
    """One epoch's figures (see the report's "What the figures count")."""

    state: str  # "cold" or "warm"
    seconds: float
    samples: int
    unique: int
    payload_bytes: int
    load_before: float
    load_after: float
    opens_all: int | None = None
    opens_data: int | None = None
    gets: int | None = None
    requests: int | None = None
    waits: list[float] = field(default_factory=list)  # stall mode: wait per batch, in order
    # CPU seconds during the epoch (benchmarks.data.cpu): the cell's process tree, the
    # S3 server's processes (None on the local disk), every CPU of the machine.
    cpu_loader_s: float | None = None
    cpu_server_s: float | None = None
    cpu_machine_s: float | None = None
    cpus: int | None = None


@dataclass
class CellResult:
    """A cell's epochs, or why it could not run."""

    reader: str
    source: str
    workers: int
    mode: str
    setup_s: float = 0.0
    epochs: list[Epoch] = field(default_factory=list)
    unavailable: str = ""
    note: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> CellResult:
        raw = json.loads(text)
        epochs = [Epoch(**e) for e in raw.pop("epochs")]
        return CellResult(**raw, epochs=epochs)

    def epoch(self, state: str) -> Epoch | None:
        return next((e for e in self.epochs if e.state == state), None)
