"""A DataLoader worker's heap settings: applied in workers only, never over the user's own.

Each case runs in a fresh interpreter (malloc settings are per process and cannot be
undone); glibc's ``mallinfo2`` shows the effect: a 1 MiB object from the heap rather
than an ``mmap`` of its own, and freed memory kept at the heap top rather than trimmed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mouthguard.data import StreamingDataLoader, StreamingDataset
from mouthguard.data.loading import heap
from mouthguard.errors import ConfigError

from ..helpers import write_dataset

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)

_PROBE = """
import ctypes, json, sys
from mouthguard.data.loading.heap import keep_heap_warm

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = [keep_heap_warm() for _ in range(2)] if sys.argv[1] == "apply" else []
before = libc.mallinfo2().hblks
big = bytearray(1024 * 1024)           # past glibc's default mmap threshold (128 KiB)
mapped = libc.mallinfo2().hblks - before
parts = [bytearray(1024 * 1024) for _ in range(10)]
del parts                               # 10 MiB freed at the heap top
kept = libc.mallinfo2().keepcost
print(json.dumps({"applied": applied, "mapped": mapped, "kept": kept}))
"""


def _probe(mode: str, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    clean.pop(heap.OPT_OUT_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_applied_a_sample_comes_from_the_heap_and_freed_memory_stays() -> None:
    got = _probe("apply")
    assert got["applied"] == [True, True]  # once per process; the second call is a no-op
    assert got["mapped"] == 0  # 1 MiB below the 32 MiB mmap threshold: from the heap
    assert got["kept"] >= 10 * 1024 * 1024  # not trimmed back to the kernel


def test_without_it_glibc_maps_and_trims() -> None:
    got = _probe("leave")
    assert got["mapped"] == 1  # the default threshold: an mmap of its own
    assert got["kept"] < 10 * 1024 * 1024  # trimmed


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
        {heap.OPT_OUT_ENV: "default"},
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(env: dict[str, str]) -> None:
    got = _probe("apply", **env)
    assert got["applied"] == [False, False]
    assert got["mapped"] == 1


def test_a_wrong_choice_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(heap.OPT_OUT_ENV, "off")
    with pytest.raises(ConfigError, match="MOUTHGUARD_WORKER_HEAP must be 'warm' or 'default'"):
        heap.keep_heap_warm()


def test_a_process_that_declined_does_not_look_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_declined_in", None)
    monkeypatch.setenv(heap.OPT_OUT_ENV, "default")
    assert heap.keep_heap_warm() is False

    def no_second_look() -> tuple[str, str]:
        raise AssertionError("libc_ver read again (it reads the interpreter's executable)")

    monkeypatch.setattr(heap.platform, "libc_ver", no_second_look)
    monkeypatch.setenv(heap.OPT_OUT_ENV, "warm")
    assert heap.keep_heap_warm() is False  # every later iteration of this worker
    assert heap._done_in is None


def _heap_state(batch: list[dict[str, Any]]) -> list[Any]:
    return [os.getpid(), heap._done_in]


def test_applied_in_the_workers_and_not_in_the_training_process(tmp_path: Path) -> None:
    write_dataset(tmp_path, n=8)
    dataset = StreamingDataset(tmp_path / "ds", batch_size=4)
    assert list(dataset)  # iterated in this process: nothing applied here
    assert heap._done_in is None
    loader = StreamingDataLoader(dataset, num_workers=1, collate_fn=_heap_state)
    states = list(loader)
    assert states and all(pid == done and pid != os.getpid() for pid, done in states)
