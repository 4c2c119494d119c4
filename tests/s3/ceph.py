"""A throwaway single-node Ceph cluster with RADOS Gateway (S3) on 127.0.0.1.

The usual single-node test recipe, in Python: one monitor, one memstore
OSD (all data in RAM), no manager, cephx off, and radosgw with a beast frontend
on a free loopback port. Everything lives in a fresh temporary directory, which
is removed again on :meth:`CephCluster.stop`. Start-up takes about a second.

Nothing is left running: every daemon gets ``PR_SET_PDEATHSIG`` (it dies with
the Python process, even one killed with SIGKILL), ``stop`` kills them by handle
and by pid file, and an ``atexit`` hook calls ``stop`` for clusters a test
session forgot.

Pitfalls the configuration works around (found the hard way):

* radosgw defaults ``ms_mon_client_mode`` to ``secure``, impossible with auth
  off, and then hangs: it is set to ``crc``.
* the monitor commits map changes once a second by default; with
  ``paxos_propose_interval = 0.05`` radosgw is up in ~1 s instead of ~11 s.
* beast without ``tcp_nodelay=1`` lets Nagle and delayed ACKs add 40 ms to every
  response with a body (ranged GETs: 44 ms instead of 1 ms).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: The programs the cluster needs (Debian packages ceph-mon, ceph-osd, radosgw, ceph-common).
BINARIES = (
    "ceph-mon",
    "ceph-osd",
    "radosgw",
    "radosgw-admin",
    "ceph-authtool",
    "monmaptool",
    "ceph",
)
# Bounds on every wait: a healthy start takes ~1 s on a 2-core machine.
_COMMAND_TIMEOUT = 60.0
_START_TIMEOUT = 90.0
_STOP_GRACE = 0.5
_LOG_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1


class CephStartError(RuntimeError):
    """The cluster did not come up; the message carries the tails of the daemon logs."""


@dataclass(frozen=True)
class S3Endpoint:
    """Where and how to reach a running S3 server."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"


def missing_binaries() -> list[str]:
    """The Ceph programs that are not on ``PATH`` (empty when the cluster can start)."""
    return [name for name in BINARIES if shutil.which(name) is None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL the
    # daemon when the process that started it dies, however it dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_CONF = """\
[global]
fsid = {fsid}
mon_host = [v2:127.0.0.1:{mon_port}]
public_addr = 127.0.0.1
ms_bind_msgr1 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = true
run_dir = {dir}/run
admin_socket = {dir}/run/$name.asok
pid_file = {dir}/run/$name.daemonpid
log_file = {dir}/log/$name.log
keyring = {dir}/keyring
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
mon_max_pg_per_osd = 1000
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_crush_initial_weight = 1
mon_osd_down_out_interval = 0

[mon]
mon_data = {dir}/mon.$id
paxos_propose_interval = 0.05
paxos_min_wait = 0.01

[osd]
osd_data = {dir}/osd.$id
osd_objectstore = memstore
memstore_device_bytes = 4294967296

[client.rgw.a]
rgw_data = {dir}/rgw
rgw_frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
ms_mon_client_mode = crc
"""


class CephCluster:
    """One throwaway cluster. ``start()`` returns the S3 endpoint; ``stop()`` removes all.

    Args:
        access_key: the access key of the S3 user created at start.
        secret_key: its secret key.
        base_dir: where the temporary directory goes (default: ``$TMPDIR`` or /tmp;
            keep it short, Unix socket paths are limited to 107 bytes).
    """

    def __init__(
        self,
        access_key: str = "testaccesskey",
        secret_key: str = "testsecretkey",
        base_dir: str | None = None,
    ) -> None:
        self._access_key, self._secret_key = access_key, secret_key
        self._base_dir = base_dir
        self.directory: Path | None = None
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._steps = 0

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- start ---------------------------------------------------------------------

    def start(self) -> S3Endpoint:
        """Start mon, OSD and radosgw, create the S3 user, and return the endpoint.

        Raises:
            CephStartError: a step failed or timed out; everything started so far
                has been stopped and removed, and the message holds the log tails.
        """
        if self.directory is not None:
            raise RuntimeError("this cluster was started already")
        if missing := missing_binaries():
            raise CephStartError(f"Ceph programs missing: {', '.join(missing)}")
        self.directory = Path(tempfile.mkdtemp(prefix="ceph-s3.", dir=self._base_dir))
        atexit.register(self.stop)
        try:
            return self._start(self.directory)
        except (OSError, subprocess.SubprocessError, CephStartError) as exc:
            message = f"{exc}\n{self._log_tails()}"
            self.stop()
            raise CephStartError(message) from exc

    def _start(self, d: Path) -> S3Endpoint:
        for sub in ("mon.a", "osd.0", "rgw", "run", "log"):
            (d / sub).mkdir()
        mon_port, rgw_port = free_port(), free_port()
        while rgw_port == mon_port:
            rgw_port = free_port()
        fsid = str(uuid.uuid4())
        conf = d / "ceph.conf"
        conf.write_text(_CONF.format(fsid=fsid, mon_port=mon_port, rgw_port=rgw_port, dir=d))
        c = ["-c", str(conf)]
        keyring, monmap = str(d / "keyring"), str(d / "monmap")
        mon_addr = f"[v2:127.0.0.1:{mon_port}]"
        mon_key = ["-n", "mon.", "--cap", "mon", "allow *"]
        self._run("ceph-authtool", "--create-keyring", keyring, "--gen-key", *mon_key)
        self._run("monmaptool", "--create", "--fsid", fsid, "--addv", "a", mon_addr, monmap)
        self._run("ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self._spawn("mon.a", "ceph-mon", *c, "-f", "-i", "a")
        # `ceph osd new` waits (bounded) until the monitor answers.
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", *c, "--connect-timeout", "30", "osd", "new", osd_uuid).strip()
        self._run("ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._spawn(f"osd.{osd_id}", "ceph-osd", *c, "-f", "-i", osd_id)
        self._spawn("rgw.a", "radosgw", *c, "-f", "-n", "client.rgw.a")
        endpoint = f"http://127.0.0.1:{rgw_port}"
        self._wait_for_http(endpoint)
        user = ["user", "create", "--uid=tester", "--display-name=tester"]
        keys = [f"--access-key={self._access_key}", f"--secret-key={self._secret_key}"]
        self._run("radosgw-admin", *c, *user, *keys)
        return S3Endpoint(endpoint, self._access_key, self._secret_key)

    def _run(self, *argv: str) -> str:
        assert self.directory is not None
        self._steps += 1
        log = self.directory / "log" / f"{self._steps:02d}-{argv[0]}.out"
        try:
            done = subprocess.run(argv, capture_output=True, timeout=_COMMAND_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as exc:
            raise CephStartError(
                f"{argv[0]} did not finish within {_COMMAND_TIMEOUT:.0f} s"
            ) from exc
        log.write_bytes(done.stdout + done.stderr)
        if done.returncode != 0:
            raise CephStartError(
                f"{' '.join(argv[:3])} ... failed with exit code {done.returncode}"
            )
        return done.stdout.decode(errors="replace")

    def _spawn(self, name: str, *argv: str) -> None:
        assert self.directory is not None
        with (self.directory / "log" / f"{name}.out").open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, before exec
                start_new_session=True,  # a Ctrl-C in the terminal is pytest's to handle
            )
        self._daemons[name] = proc
        (self.directory / f"{name}.pid").write_text(str(proc.pid))

    def _wait_for_http(self, endpoint: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            for name, proc in self._daemons.items():
                if proc.poll() is not None:
                    raise CephStartError(f"{name} exited with code {proc.returncode}")
            try:
                with urllib.request.urlopen(endpoint, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer (403 for anonymous) means radosgw is serving
            except OSError:
                time.sleep(0.1)
        raise CephStartError(f"radosgw did not answer on {endpoint} within {_START_TIMEOUT:.0f} s")

    def _log_tails(self) -> str:
        if self.directory is None or not (self.directory / "log").is_dir():
            return ""
        tails = []
        for log in sorted((self.directory / "log").iterdir()):
            with contextlib.suppress(OSError):
                lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
                if lines:
                    tails.append(f"== {log.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    # --- stop ----------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every daemon (by handle, then by pid file) and remove the directory. Idempotent."""
        directory, self.directory = self.directory, None
        if directory is None:
            return
        atexit.unregister(self.stop)
        # memstore keeps nothing worth a clean shutdown, and radosgw needs ~12 s to
        # exit on SIGTERM: a short grace, then SIGKILL.
        for proc in self._daemons.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + _STOP_GRACE
        for proc in self._daemons.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=_COMMAND_TIMEOUT)
        self._daemons.clear()
        _kill_by_pid_files(directory)
        shutil.rmtree(directory, ignore_errors=True)


def _kill_by_pid_files(directory: Path) -> None:
    """SIGKILL any daemon recorded in ``directory`` that is still ours (its argv names our conf)."""
    conf = str(directory / "ceph.conf")
    for pid_file in directory.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if conf.encode() in cmdline:
                os.kill(pid, signal.SIGKILL)
