"""The S3 source: the project's throwaway Ceph RGW on 127.0.0.1, and its request log.

The server is :class:`tests.s3.ceph.CephCluster` (the test suite's launcher:
one monitor, one memstore OSD, radosgw on a free loopback port), started by the
benchmark and stopped when it ends. Its OSD keeps every object in RAM (4 GiB at
most), so the peers' copies are uploaded one reader at a time, deleted after
that reader's cells, and their space reclaimed at once (:meth:`Server.reclaim`).

Requests are counted from radosgw's own access log: its beast frontend logs one
line per request (``"GET /bucket/key HTTP/1.1" 206 ...``) at the default log
level; a cell notes the log's size before an epoch and counts the lines written
after it, once the log has stopped growing.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from benchmarks.data.config import BUCKET, Site
from benchmarks.data.latency import LatencyProxy

_REQUEST = re.compile(rb'beast: \S+ \S+ - \S+ \[[^\]]*\] "([A-Z]+) ')
_SETTLE, _SETTLE_MAX = 0.3, 5.0


def requests_since(log: Path, offset: int) -> Counter[str]:
    """Requests by method logged after byte ``offset``, once the log stops growing."""
    deadline = time.monotonic() + _SETTLE_MAX
    size = log.stat().st_size
    while time.monotonic() < deadline:
        time.sleep(_SETTLE)
        now = log.stat().st_size
        if now == size:
            break
        size = now
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read()
    return Counter(m.decode() for m in _REQUEST.findall(text))


def log_size(log: Path) -> int:
    return log.stat().st_size


class StartError(RuntimeError):
    """The server did not start; the message says why."""


class Server(AbstractContextManager["Server"]):
    """``with Server() as s:`` a running RGW with :data:`BUCKET`; ``s.site``, ``s.env``.

    Raises:
        StartError: the server did not start (the message says why).
    """

    def __init__(self) -> None:
        from tests.s3.ceph import CephCluster  # noqa: PLC0415 - the test suite's launcher

        self._cluster = CephCluster()
        self.site: Site | None = None
        self.env: dict[str, str] = {}
        self.version = "?"

    def __enter__(self) -> Server:
        from tests.s3.ceph import CephStartError, missing_binaries  # noqa: PLC0415

        if missing := missing_binaries():
            raise StartError(f"Ceph programs missing: {', '.join(missing)} (make system-deps)")
        try:
            endpoint = self._cluster.start()
        except CephStartError as exc:
            raise StartError(f"the Ceph RGW did not start: {str(exc)[:500]}") from exc
        assert self._cluster.directory is not None
        log = self._cluster.directory / "log" / "client.rgw.a.log"
        self.site = Site(endpoint.endpoint, BUCKET, str(log))
        self.env = {
            "AWS_ACCESS_KEY_ID": endpoint.access_key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret_key,
            "AWS_REGION": endpoint.region,
            "AWS_DEFAULT_REGION": endpoint.region,
            "AWS_ENDPOINT_URL": endpoint.endpoint,
            "S3_ENDPOINT_URL": endpoint.endpoint,  # mosaicml-streaming's setting
        }
        try:
            self._create_bucket()
        except Exception as exc:
            self._cluster.stop()
            raise StartError(f"the bucket could not be created: {exc}") from exc
        self.version = _version()
        return self

    def reclaim(self) -> str:
        """Free the space of deleted objects now; '' or why it failed.

        radosgw deletes an object's tail (all but its first 4 MiB) through its garbage
        collector, two hours later by default: without this, the OSD's 4 GiB fill up
        after a few readers' copies and every write blocks.
        """
        import subprocess  # noqa: PLC0415

        assert self._cluster.directory is not None
        conf = str(self._cluster.directory / "ceph.conf")
        argv = ["radosgw-admin", "-c", conf, "gc", "process", "--include-all"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        return "" if done.returncode == 0 else done.stderr.strip()[-300:]

    def _create_bucket(self) -> None:
        from benchmarks.data.writers import s3_client  # noqa: PLC0415

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            s3_client().create_bucket(Bucket=BUCKET)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cluster.stop()


#: The environment variables that name the endpoint (every client reads one of them).
_ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL")


@dataclass(frozen=True)
class Route:
    """How the cells reach the server: its site and client settings (maybe via a proxy)."""

    site: Site
    env: dict[str, str]
    delay_s: float


@contextmanager
def delayed(server: Server, delay_s: float) -> Iterator[Route]:
    """The server as the cells see it: through a :class:`LatencyProxy` when ``delay_s`` > 0.

    With no delay the route is the server itself. With one, every endpoint setting
    points at the proxy, so every reader's requests (mouthguard's and the peers')
    pay the same delay; the server's request log still counts them (the proxy
    changes no byte). The proxy stops when the block ends.
    """
    assert server.site is not None
    if delay_s <= 0:
        yield Route(server.site, server.env, 0.0)
        return
    target = urlsplit(server.site.endpoint)
    assert target.hostname is not None
    assert target.port is not None
    with LatencyProxy(target.hostname, target.port, delay_s) as proxy:
        env = {**server.env, **dict.fromkeys(_ENDPOINT_VARS, proxy.endpoint)}
        yield Route(replace(server.site, endpoint=proxy.endpoint), env, delay_s)


def _version() -> str:
    import subprocess  # noqa: PLC0415

    try:
        done = subprocess.run(
            ["radosgw", "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    words = done.stdout.split()
    return words[2] if len(words) > 2 and words[0] == "ceph" else (done.stdout.strip() or "?")
