"""MouthguardConnector's scheduler side in vLLM's call order, without an engine.

``vllm_scripts/connector_order.py`` builds the connector's two roles from a real
``VllmConfig`` (no engine: seconds, not minutes) and drives one request per case
through the scheduler-side methods in the order vLLM's scheduler calls them, the
worker's load in between. A request that stops in the step its load ran in
(``max_tokens=1``) is finished (``request_finished``) before the connector sees
that step's output (``update_connector_output``): its load must still count.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integrations.vllm_env import run_script

pytestmark = [pytest.mark.timeout(600)]

LOADED = 3 * 16  # the prompt's 3 stored blocks of 16 tokens


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_script("connector_order.py", tmp_path_factory.mktemp("vllm-order"), timeout=540)


def test_every_case_loads_the_saved_pages_inside_the_forward(run: dict[str, Any]) -> None:
    for name, case in run.items():
        assert case["offered"] == LOADED, name
        assert case["asynchronous"] is False, name
        assert case["errors"] == [], name
        assert case["pages_match"] is True, name


def test_a_request_that_stops_in_its_load_step_reports_the_load(run: dict[str, Any]) -> None:
    counts = run["stops_in_load_step"]["counts"]
    assert counts == {"loaded_tokens": LOADED, "failed_tokens": 0, "async_loads": 0}


def test_a_request_that_runs_on_counts_its_load_once(run: dict[str, Any]) -> None:
    # update_connector_output settled the load first: request_finished adds nothing
    counts = run["runs_on"]["counts"]
    assert counts == {"loaded_tokens": LOADED, "failed_tokens": 0, "async_loads": 0}


def test_a_request_finished_with_an_error_in_its_load_step_counts_it_failed(
    run: dict[str, Any],
) -> None:
    # policy "fail": vLLM finishes a request whose load failed with FINISHED_ERROR,
    # before the connector sees which pages failed; none of the load is claimed
    counts = run["failed_with_error"]["counts"]
    assert counts == {"loaded_tokens": 0, "failed_tokens": LOADED, "async_loads": 0}
