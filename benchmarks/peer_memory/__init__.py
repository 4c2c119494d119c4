"""Peer memory: resuming after a lost node from peer memory vs from the durable tier
(the local disk read cold, and S3), and the stall of ``save_async`` with peer
replication vs a plain async save.

``python -m benchmarks.peer_memory`` starts 4 gloo ranks on loopback as 2
simulated nodes of 2 (torchrun's ``GROUP_RANK``), once per state size. In each
job every rank holds ``size`` bytes of state and has two checkpointers on the
same disk: a plain one (every save to disk) and one with
``PeerMemory(replication_factor=2)`` under /dev/shm (routine saves to peer
memory only); and, when the Ceph programs are installed, a third whose store's
only tier is S3 (a throwaway Ceph RGW on 127.0.0.1 started by the benchmark,
:class:`tests.s3.ceph.CephCluster`: one memstore OSD, so the objects sit in the
OSD's RAM and every read crosses loopback HTTP). Then:

* **stall**: ``rounds`` routine ``save_async`` calls per disk/peer checkpointer,
  the two alternating (which goes first alternates too); each figure is the time
  ``save_async`` blocked its caller (``info.stall_seconds``), after
  ``prepare(state)``, the previous save committed. The job's stall per round is
  the slowest rank's. The save time (call to commit, replication included) is
  reported beside it. The S3 checkpointer saves the same state once, as step
  ``rounds``, after these rounds (its save is not timed).
* **recovery**: every rank calls ``load()`` on each checkpointer in turn. The
  plain checkpointer's reads the newest step from the disk after its rank files
  were evicted from the page cache (``posix_fadvise DONTNEED`` on each clean
  file). The S3 checkpointer's reads it from the RGW (ranged GETs, every byte
  hashed). Then node 1's area is deleted (its memory lost) and the peer
  checkpointer's ``load()`` runs: ranks 0-1 read from their own node's area,
  ranks 2-3 receive their files from node 0 over gloo first. Each recovery is
  the slowest rank's ``load()``, from the call to the verified state in hand;
  process restart and ``Checkpointer`` construction (the same for all) are not
  counted. Every recovery is run ``RECOVERIES`` times (node 1's area deleted
  again before each); the figure is their median. Every loaded state is
  compared with the saved one, tensor by tensor.

Writes ``docs/benchmarks-peer-memory.md``. With ``--profile`` every rank also
runs one more peer-memory and one more S3 recovery ``load()`` per size, after
the timed ones, under cProfile, and the slowest rank's profile of each is
printed after the report; those two recoveries count in no figure (the
profiler's overhead makes them slower than the timed ones). A run with
``--profile`` writes its report only where ``--out`` says.
"""

from __future__ import annotations

from benchmarks.state import REPO

DEFAULT_OUT = REPO / "docs" / "benchmarks-peer-memory.md"
WORLD = 4
#: Whole-job limit per size: a rank that hangs fails the run, never the machine.
JOB_TIMEOUT_SECONDS = 900.0
#: The issue's targets: recovery from peer memory vs the durable tier read cold
#: (disk with its page cache dropped, or S3), and the stall with replication vs a
#: plain async save.
TARGET_RECOVERY = 5.0
TARGET_STALL = 1.25
#: Recoveries per size and source; the figure is their median, each the slowest rank's.
RECOVERIES = 3
#: Functions of each profile printed with ``--profile`` (by cumulative time).
PROFILE_LINES = 30
#: The recoveries timed in every job, in the order each rank runs them.
SOURCES = ("disk", "s3", "peers")
