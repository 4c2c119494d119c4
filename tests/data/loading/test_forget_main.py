"""The fork server's last preload forgets the main module imported by name, and only there."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from mouthguard.data.loading.forget_main import MAIN_ENV, forget_preloaded_main


def _module(name: str, spec_name: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = None if spec_name is None else importlib.machinery.ModuleSpec(spec_name, None)
    return module


def test_the_named_module_is_forgotten_where_it_is_not_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "__main__", _module("__main__", None))  # the server's -c
    monkeypatch.setitem(sys.modules, "trainer.run", _module("trainer.run", "trainer.run"))
    monkeypatch.setenv(MAIN_ENV, "trainer.run")
    assert forget_preloaded_main() == "trainer.run"
    assert "trainer.run" not in sys.modules


def test_the_program_itself_is_never_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", _module("__main__", "trainer.run"))
    monkeypatch.setitem(sys.modules, "trainer.run", _module("trainer.run", "trainer.run"))
    monkeypatch.setenv(MAIN_ENV, "trainer.run")
    assert forget_preloaded_main() is None
    assert "trainer.run" in sys.modules


@pytest.mark.parametrize("value", [None, ""])
def test_nothing_named_nothing_done(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    monkeypatch.setitem(sys.modules, "__main__", _module("__main__", None))
    monkeypatch.setitem(sys.modules, "trainer.run", _module("trainer.run", "trainer.run"))
    if value is None:
        monkeypatch.delenv(MAIN_ENV, raising=False)
    else:
        monkeypatch.setenv(MAIN_ENV, value)
    assert forget_preloaded_main() is None
    assert "trainer.run" in sys.modules


def test_a_name_not_imported_is_reported_as_not_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", _module("__main__", None))
    monkeypatch.delitem(sys.modules, "trainer.never", raising=False)
    monkeypatch.setenv(MAIN_ENV, "trainer.never")
    assert forget_preloaded_main() is None
