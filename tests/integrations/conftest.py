"""Marks the engine tests, so that ``make test`` can run them after .venv-vllm is built.

A test module that drives a script in the vLLM environment through
:func:`tests.integrations.vllm_env.run_script` is an engine test: every test in it gets
the ``engine`` marker, whether or not the module remembered to say so.
"""

from __future__ import annotations

import pytest

from tests.integrations import vllm_env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if getattr(module, "run_script", None) is vllm_env.run_script:
            item.add_marker(pytest.mark.engine)
