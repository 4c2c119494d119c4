"""Dataset loader benchmarks: mouthguard's streaming loader next to its peers.

``python -m benchmarks.data`` writes one synthetic dataset of ~100 KiB samples in
every peer's own format (raw small files, webdataset tar shards, mosaicml-streaming
MDS, litdata chunks, mouthguard shards), reads each back from the local disk and
from a throwaway Ceph RGW on 127.0.0.1, cold and warm, with 0 and 4 DataLoader
workers, counts the files each opens (``perf stat`` on the open syscalls) and the
GET requests the S3 server saw, times a simulated training loop's stall, and writes
a markdown report. See ``benchmarks/README.md`` ("Dataset loaders").

Modules, one job each: :mod:`~benchmarks.data.config` (what a measurement is),
:mod:`~benchmarks.data.samples` (the samples), :mod:`~benchmarks.data.writers`
(every format), :mod:`~benchmarks.data.readers` (every loader),
:mod:`~benchmarks.data.opens` (counting opens), :mod:`~benchmarks.data.s3` (the
S3 server, uploads, GET counts), :mod:`~benchmarks.data.child` (one measurement
in a fresh process), :mod:`~benchmarks.data.report` (the markdown) and
:mod:`~benchmarks.data.run` (the command).
"""
