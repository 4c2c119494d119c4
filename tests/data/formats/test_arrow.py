"""pyarrow is optional: Parquet without it says what to install; WebDataset never loads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mouthguard.data import StreamingDataset, index_dataset
from mouthguard.data.formats.arrow import PARQUET_EXTRA, pyarrow_modules
from mouthguard.errors import MissingDependencyError

from ..adopted import parquet_files, wds_tars


@pytest.fixture
def no_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter where ``import pyarrow`` fails, as it does where it is not installed."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)


def test_the_error_is_one_line_naming_the_extra(no_pyarrow: None) -> None:
    with pytest.raises(MissingDependencyError) as caught:
        pyarrow_modules()
    assert PARQUET_EXTRA in str(caught.value) and "\n" not in str(caught.value)
    assert PARQUET_EXTRA == "pip install 'mouthguard[parquet]'"


def test_indexing_and_streaming_parquet_need_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parquet_files(tmp_path / "a", files=1)
    parquet_files(tmp_path / "b", files=1)
    index_dataset(tmp_path / "b")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MissingDependencyError, match=r"mouthguard\[parquet\]"):
        index_dataset(tmp_path / "a")
    assert not (tmp_path / "a" / "mouthguard-index").exists()
    with pytest.raises(MissingDependencyError, match=r"mouthguard\[parquet\]"):
        StreamingDataset(tmp_path / "b")


_PROBE = """
import json, sys
from mouthguard.data import StreamingDataset, index_dataset, verify_dataset
index_dataset(sys.argv[1])
rows = sum(1 for _ in StreamingDataset(sys.argv[1]))
assert verify_dataset(sys.argv[1]).ok
sys.stdout.write(json.dumps([rows, sorted(m for m in sys.modules if m.split(".")[0] == "pyarrow")]))
"""


@pytest.mark.slow
def test_the_webdataset_path_never_imports_pyarrow(tmp_path: Path) -> None:
    wds_tars(tmp_path / "mine", shards=2, per=3)
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "mine")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [6, []]
