"""One 2-rank save shared by the DCP tests (spawning gloo processes costs seconds)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dcp import workers
from tests.distributed import run_distributed


@dataclass(frozen=True)
class Saved:
    """The store the 2-rank save wrote (read-only: copy it before changing anything)."""

    root: Path
    ranks: list[dict[str, Any]]

    def copy(self, dest: Path) -> Path:
        """A private, writable copy of the store (relocatable: the default config)."""
        shutil.copytree(self.root, dest)
        return dest


@pytest.fixture(scope="session")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """Steps 1, 2, 4 committed by 2 gloo ranks; step 3 failed on rank 1 (see workers)."""
    root = tmp_path_factory.mktemp("dcp") / "store"
    ranks = run_distributed(workers.save_two_ranks, 2, str(root))
    return Saved(root, ranks)
