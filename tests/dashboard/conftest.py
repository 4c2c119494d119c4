"""Fixtures of the dashboard tests: the store in every state, served on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mouthguard
from tests.dashboard.helpers import Served, ops_store, serving


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> mouthguard.Store:
    """:func:`~tests.dashboard.helpers.ops_store`, once per module (tests only read it)."""
    return ops_store(tmp_path_factory.mktemp("ops") / "store")


@pytest.fixture(scope="module")
def served(ops: mouthguard.Store) -> Iterator[Served]:
    """``ops`` served read-only on 127.0.0.1."""
    with serving(ops) as served:
        yield served
