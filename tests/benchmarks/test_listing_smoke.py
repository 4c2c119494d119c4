"""``python -m benchmarks.listing`` runs end to end on a few objects (rows, never timings).

It starts the Ceph RGW as the S3 tests do (``make system-deps`` installs Ceph).
"""

from __future__ import annotations

import pytest

from benchmarks import listing

pytestmark = pytest.mark.slow


def test_the_listing_benchmark_prints_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert listing.main(["--counts", "30", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 30 | list + head | 1 LIST + 30 HEAD |" in out
    assert "| 30 | list_info | 1 LIST |" in out
