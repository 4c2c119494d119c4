"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

import mouthguard

#: The S3 test server (a real Ceph RADOS Gateway on loopback) and its buckets.
pytest_plugins = ["tests.s3.fixtures"]


@pytest.fixture
def store(tmp_path: Path) -> mouthguard.Store:
    """A fresh embedded default store in a temporary directory."""
    return mouthguard.open_store(tmp_path / "store")


@pytest.fixture
def ckpt(store: mouthguard.Store) -> mouthguard.Checkpointer:
    """A checkpointer for run ``r`` on a fresh store, without background replication.

    Core tests damage bytes on purpose and check what load() does; a background
    repair racing them would make the outcome depend on timing. Replication has
    its own tests in tests/jobs.
    """
    return mouthguard.Checkpointer(store, run="r", background=False)
