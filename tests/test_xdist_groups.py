"""The suite's parallel run keeps an ``xdist_group`` on one worker.

`make test` runs ``pytest -n auto --dist loadgroup``; tests that share one
expensive fixture or one resource are marked ``xdist_group`` so that a single
worker runs them all. That works only while pytest-xdist can tag the marked
tests, which pytest 9.2 broke (constraints.txt pins below it). This test fails
if the tagging is lost again, rather than letting the suite silently run each
group's fixtures once per worker.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("grouping-probe")


def test_a_grouped_test_is_tagged_with_its_group_under_loadgroup(
    request: pytest.FixtureRequest,
) -> None:
    # On a worker, xdist sets option.loadgroup from the controller's --dist.
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only meaningful on a pytest-xdist worker under --dist loadgroup")
    # xdist's loadgroup scheduler sends tests to workers by this suffix.
    assert request.node.nodeid.endswith("@grouping-probe"), request.node.nodeid
