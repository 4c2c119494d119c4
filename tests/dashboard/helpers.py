"""A store in every state the page shows, a served dashboard, and a headless browser."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

import mouthguard
from mouthguard.checkpoint.sidecars import CopyRef, mark_suspect
from mouthguard.checkpoint.verification import verify_and_record
from mouthguard.dashboard import DashboardThread, SnapshotCache, Sources, create_app
from mouthguard.dashboard.snapshot_cache import utc_now
from mouthguard.jobs.replicator import Replicator
from tests.checkpoint.helpers import step_path

TOKEN = "a-test-token-of-32-characters-xx"


def ops_store(root: Path) -> mouthguard.Store:
    """Two runs in every state an operator meets.

    alpha: 10 routine and 20 milestone replicated and verified (protected), 20 held
    ("release-candidate"), 30 routine on the fast tier only (committed), with the
    reference values loss nan (a diverged run) and tokens 4096, marked suspect. beta: steps 1-5
    routine, replicated; 1 and 2 fall out of keep-last 3 (trash pending); 5's fast
    copy is damaged (a damage report).
    """
    store = mouthguard.open_store(root)
    alpha = mouthguard.Checkpointer(store, "alpha", background=False)
    alpha.save(10, {"w": torch.ones(64)}, importance="routine")
    alpha.save_async(20, {"w": torch.ones(256)}, importance="milestone").result()
    beta = mouthguard.Checkpointer(store, "beta", background=False)
    for step in range(1, 6):
        beta.save(step, {"w": torch.full((32,), float(step))})
    Replicator(store).run_once()
    alpha.hold(20, "release-candidate", reason="rc1")
    alpha.save(30, {"w": torch.zeros(16)}, reference={"loss": float("nan"), "tokens": 4096})
    mark_suspect(CopyRef(store.fast, "alpha", 30), "the loss is NaN", utc_now())
    rank = step_path(store, "beta", 5) / "rank-00000.safetensors"
    raw = bytearray(rank.read_bytes())
    raw[-1] ^= 0xFF
    rank.write_bytes(bytes(raw))
    assert not verify_and_record(CopyRef(store.fast, "beta", 5)).ok
    return store


@dataclass
class Served:
    """A dashboard on loopback: its URL, cache and store."""

    url: str
    cache: SnapshotCache
    store: mouthguard.Store

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """GET ``path``: (status, body), whatever the status."""
        return self.request("GET", path, headers=headers)

    def json(self, path: str) -> Any:
        """GET ``path`` and parse its JSON (status 200 asserted)."""
        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send one request: (status, body), whatever the status."""
        req = urllib.request.Request(
            self.url + path, data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@contextmanager
def serving(
    store: mouthguard.Store,
    *,
    token: str | None = None,
    sources: Sources | None = None,
    now: dt.datetime | None = None,
) -> Iterator[Served]:
    """``store``'s dashboard on 127.0.0.1 (a free port); every request reads the store again."""
    clock = utc_now if now is None else (lambda: now)
    cache = SnapshotCache(store, max_age=0.0, background=False, now=clock)
    with DashboardThread(create_app(cache, token=token, sources=sources)) as thread:
        yield Served(thread.address.url, cache, store)


def chromium() -> str:
    """The headless browser's path; skips the test where none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip("no chromium: scripts/install-system-deps.sh installs Debian's")


def browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Load ``url`` in headless chromium, scripts run to completion, with extra ``args``."""
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",  # root in CI containers
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        # Virtual time runs the page's timers and waits for its fetches, so the DOM
        # is complete when dumped, however slow the machine.
        "--virtual-time-budget=20000",
        *args,
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@dataclass
class Element:
    """One element of a rendered page: tag, attributes, its text."""

    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] | None = None


class _Tree(HTMLParser):
    """Just enough of a DOM: elements with attributes, children and text."""

    VOID = frozenset({"meta", "link", "input", "br", "img", "hr"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Element("root", {}, children=[])
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Element(tag, {k: v or "" for k, v in attrs}, children=[])
        assert self.stack[-1].children is not None
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        for node in self.stack[1:]:
            node.text += data


def parse_dom(html: str) -> Element:
    """The element tree of ``html``."""
    tree = _Tree()
    tree.feed(html)
    return tree.root


def find_all(node: Element, tag: str, **attrs: str) -> list[Element]:
    """Every descendant with ``tag`` whose attributes include ``attrs`` (``_`` for ``-``)."""
    want = {k.replace("_", "-"): v for k, v in attrs.items()}
    found = []
    for child in node.children or []:
        if child.tag == tag and all(child.attrs.get(k) == v for k, v in want.items()):
            found.append(child)
        found.extend(find_all(child, tag, **attrs))
    return found


def by_id(node: Element, ident: str) -> Element:
    """The one descendant with ``id``."""
    for child in node.children or []:
        if child.attrs.get("id") == ident:
            return child
        try:
            return by_id(child, ident)
        except LookupError:
            continue
    raise LookupError(ident)
