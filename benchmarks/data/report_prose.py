"""The data report's fixed prose: the targets it judges, what its figures count, the peers.

Kept apart from :mod:`benchmarks.data.report`, which lays out the measured tables,
so that the words a reader checks the numbers against are in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.data.report import RunInfo
    from benchmarks.harness import CacheDrop

#: The warm stall target: p99 of the per-step wait at most the in-memory floor's + this (ms).
FLOOR_MARGIN_MS = 1.0
#: Targets: mouthguard's samples/s over the best peer's, per table.
THROUGHPUT_GOAL = 1.0


def cache_text(drop: CacheDrop) -> str:
    """What was done to make an epoch cold (see :class:`benchmarks.harness.CacheDrop`)."""
    text = "`fsync` + `posix_fadvise(POSIX_FADV_DONTNEED)` on every file of the reader's dataset"
    if drop.drop_caches_ok:
        return text + ", then `echo 3 > /proc/sys/vm/drop_caches` (permitted)"
    if drop.drop_caches_ok is False:
        return text + f"; `/proc/sys/vm/drop_caches` **not permitted** ({drop.drop_caches_error})"
    return text


def s3_line(info: RunInfo) -> str:
    """The S3 source as the report describes it: the server, or why there was none."""
    if "s3" not in info.sources:
        return "not measured in this run (`--sources`)"
    if info.s3_problem:
        return f"**not available**: {info.s3_problem}"
    text = (
        f"a throwaway Ceph RGW (ceph {info.server}, memstore: objects in RAM) on 127.0.0.1, "
        "started and stopped by the benchmark"
    )
    if info.s3_latency_ms > 0:
        text += (
            f"; every reader's requests in the cells went through a loopback proxy that "
            f"held each request back {info.s3_latency_ms:g} ms before passing it on "
            "(`benchmarks/data/latency.py`; bytes unchanged; uploads went straight to the "
            "server)"
        )
    return text


def workers_line(info: RunInfo) -> str:
    """Whether the DataLoader workers outlived an epoch in this run (the same for every reader)."""
    if info.persistent_workers:
        return (
            "- **workers**: every reader's DataLoader was built with `persistent_workers=True`"
            " (`--persistent-workers`): the warm epoch reused the cold epoch's worker processes."
        )
    return (
        "- **workers**: no reader's DataLoader was given `persistent_workers` (its default,"
        " False): each epoch started new worker processes (`--persistent-workers` keeps them)."
    )


def processes_line(info: RunInfo) -> str:
    """How each cell's process was started in this run."""
    if info.preloaded_children:
        return (
            "- **processes**: every cell's process was forked from one that had imported torch"
            " and nothing else (`--preloaded-children`, which `--quick` implies), about 2.7 s"
            " less per cell on 2 CPUs; each reader's own imports were still its own."
        )
    return (
        "- **processes**: every cell's process was a fresh interpreter"
        " (`python -m benchmarks.data.child`)."
    )


def targets_text(info: RunInfo) -> list[str]:
    """The targets section, with this run's step and worker counts."""
    return [
        "## Targets",
        "",
        "| what | target |",
        "|---|---|",
        "| throughput | mouthguard's samples/s at least the best peer's "
        f"(≥ {THROUGHPUT_GOAL:.1f}x) in every table: each source x cache state x workers; "
        "both mouthguard rows (in place, and with a `cache_dir`) are judged |",
        f"| stall | at a {info.step_ms:.0f} ms training step with "
        f"{', '.join(map(str, info.stall_workers)) or '-'} workers, the 99th percentile of "
        "the loop's wait for the next batch (every batch but the first): **warm**, at most "
        "the in-memory floor's (the DataLoader alone, no I/O, measured in the same table) "
        f"+ {FLOOR_MARGIN_MS:g} ms; **cold**, at most the lowest of the peers' in the same "
        "table. On S3, the cold **first batch** (the workers' start, the first ranges) at "
        "most the fastest peer's. With repeats, each reader's median over them |",
        "",
        "A target that is not met says **not met** in the verdicts at the end.",
    ]


FIGURES_TEXT = [
    "## What the figures count",
    "",
    "- One **cell** = one reader, one source, one number of DataLoader workers, in a fresh",
    "  process. Before it starts, the page cache of the reader's files is dropped and its",
    "  own cache directory (webdataset `cache_dir`, mosaicml-streaming `local`, litdata",
    "  `cache_dir`, mouthguard `cache_dir`) is deleted. The **cold** epoch is the loader's",
    "  first; the **warm** epoch is its second, in the same process (page cache and the",
    "  loader's cache populated; workers are new processes each epoch unless the library",
    "  keeps them). On S3 the server keeps every object in RAM, so \u201ccold\u201d means cold",
    "  on the client only.",
    "- An epoch is timed from `iter(loader)` (workers start then) to the last batch:",
    "  building the loader (imports, reading the dataset's index or manifest) is not",
    "  included. Every reader delivers every sample once per epoch (checked: keys counted",
    "  and deduplicated; a row says so if not), batched by the same collate function in",
    "  the workers into one `uint8` tensor per batch.",
    "- **samples/s**: samples delivered over the epoch's time. **MB/s**: payload bytes",
    "  (10^6 bytes; keys, tar headers, indexes and other metadata not counted) over the",
    "  same time. **x best peer**: samples/s over the fastest peer's in the same table",
    "  (peers: raw files, webdataset, mosaicml-streaming, litdata; not the in-memory",
    "  floor, not mouthguard).",
    "- **data files opened**: `open`/`openat`/`openat2` calls on paths under the benchmark",
    "  directory (datasets and loader caches), by the cell's process and its workers,",
    "  during the epoch only; per sample and per second of the epoch. **all opens**: every",
    "  open call in that time, any path (Python imports in spawned workers, `/dev/shm`,",
    "  `/proc`, sockets are not opens). Counted by the kernel (`perf stat` on the",
    "  `syscalls:sys_enter_open*` tracepoints, attached to the cell's process, inherited",
    "  by its workers, enabled around the epoch through perf's control FIFO); `strace -f",
    "  -c` was measured and rejected: it stops the process on every open and made the",
    "  raw-file reader 2-9x slower (0.19-0.21 s untraced, 0.45-1.90 s traced, 10,000 warm",
    "  100 KB files).",
    "- **GETs**: GET requests the S3 server logged during the epoch (radosgw's access log,",
    "  one line per request), and all requests (HEAD, LIST, ...) in brackets.",
    "- **load**: `os.getloadavg()[0]` in the cell's process just before and after the epoch.",
    "- **CPU s (loader / S3 server / machine busy)**: CPU seconds (user + system) spent",
    "  during the epoch by the cell's process and every process under it (its workers,",
    "  including those that exited during the epoch, and any `curl` a peer pipes",
    "  through); by the S3 server's processes (radosgw, its OSD and monitor; `-` on the",
    "  local disk); and the whole machine's busy share of its CPUs over the epoch (every",
    "  process, other users' included). From `/proc` (`benchmarks/data/cpu.py`), in",
    "  10 ms ticks. On a machine with few CPUs, a loader that spends more CPU per byte",
    "  leaves less to the loopback S3 server it reads from: near 100% busy, the",
    "  machine, not the loader's design, sets the pace.",
]


def stall_text(info: RunInfo) -> list[str]:
    """How the stall was measured, at this run's step."""
    return [
        "Each loader iterated with a simulated training step: after every batch the loop",
        f"sleeps {info.step_ms:.0f} ms. The wait is the time `next()` took: how long the",
        "training loop waited for data beyond its step. p50 / p99 / max over every batch but",
        "the first; the first batch's wait (starting the workers, the first shard) on its",
        "own; *all waits*, every wait of the epoch summed, the first batch's included (what",
        "the epoch's data cost the training loop in all). Cold and warm as above, in a fresh",
        "cell.",
    ]


NOTES_TEXT = [
    "## Notes on the peers",
    "",
    "- **mosaicml-streaming**: its package `__init__` imports `streaming.vision`, which",
    "  imports torchvision; torchvision's PyPI wheel is built against CUDA torch and fails",
    "  to load with the CPU torch installed here (\u201coperator torchvision::nms does not",
    "  exist\u201d). The benchmark sets `sys.modules['streaming.vision'] =",
    "  types.ModuleType('streaming.vision')` before `import streaming` (the vision",
    "  datasets are not used). On S3 it is given `S3_ENDPOINT_URL` and the `AWS_*`",
    "  credentials; it reads through boto3. Its MDS reader opens the shard file once per",
    "  sample (the \u201cdata files opened / sample\u201d column). With forked workers on S3",
    "  it is unreliable here: in 6 cold runs with 4 workers (256 MiB, outside the report)",
    "  it wrote `shard.00000.mds` into its cache twice with the right size and different",
    "  bytes, then raised in a worker (a payload of 102,409 bytes where every sample has",
    "  102,400; \u201cRelative sample index 488 is not present in the shard.00000.mds",
    "  file\u201d) -- MDS written without `hashes` is not validated -- and once hung until",
    "  botocore's 60 s read timeout. A likely cause: the workers inherit the boto3",
    "  connection the parent opened to read `index.json` (the same socket was seen open in",
    "  the parent and a worker). Such a cell is a row saying \u201cnot available\u201d with",
    "  the error; an S3 row with workers whose epoch or first batch takes about 60 s",
    "  more than its neighbours is the hang.",
    '- **litdata**: `StreamingDataset("s3://...", storage_options={"endpoint_url": ...})`',
    "  works offline against the local server, but its obstore download path builds its",
    "  own client, which refuses a plain-`http://` endpoint (reqwest `BadScheme`); the",
    "  benchmark adds `allow_http` to `litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS`",
    "  (an `https://` endpoint needs nothing). A chunk whose samples are shared between",
    "  workers is not memory-mapped (`reader.enable_mmap_for_chunks`: \u201cshared chunks",
    "  are deliberately excluded\u201d); it is read whole from the file for every decode",
    "  window instead (`item_loader._fill_decode_window_path`), which shows in its S3",
    "  rows with workers. `optimize` switches the process's",
    "  multiprocessing start method to `spawn`, so every format is written in a child",
    "  process.",
    "- **webdataset**: shards written by its own `ShardWriter` (`TarWriter`), read by",
    "  `WebDataset(urls, shardshuffle=..., cache_dir=...).shuffle(1000)`. It has no S3",
    "  client: on S3 it reads presigned `http://` URLs of the shards through its `curl`",
    "  handler, into its `cache_dir`.",
    "- **raw files on S3**: one object per sample, one boto3 `GetObject` each, no cache.",
    "- **mouthguard**: `pack()` of the raw files' directory (locally; into the bucket with",
    "  its own S3 writer), `StreamingDataset(shuffle=True)` + `StreamingDataLoader`.",
    "  Locally it reads in place by default: each 2 MiB range of a shard is hashed",
    "  (sha256) before its samples are handed out, on a thread of the first process to",
    "  open the shard, once for all the DataLoader workers of all epochs (they share a",
    "  record of what hashed right, trusted while the file's stat is unchanged). The second row",
    "  uses a `cache_dir`: on a local disk that copies every shard into the cache once",
    "  more (meant for datasets on network filesystems), then trusts its stamp. Each",
    "  worker checks and parses the index of every shard it reads, once per worker",
    "  process (every epoch unless the workers persist: see **workers** above).",
    "  On S3 (and in the `cache_dir` row) a shard is streamed into the cache range by",
    "  range: each 2 MiB range is verified against its own sha256 in the manifest before",
    "  any sample touching it is handed out, at most 8 range GETs in flight per worker,",
    "  and workers read the ranges another worker has verified rather than fetching",
    "  them again. On S3 its",
    "  workers come from multiprocessing's fork server (its S3 client does not survive",
    "  `fork` from a process that used it), started once per cell with torch and the",
    "  cell's main module preloaded; each worker opens the bucket read-only (no probe",
    "  requests that write), without the bucket check its parent made, and makes its",
    "  S3 clients only when it first sends a request.",
]
