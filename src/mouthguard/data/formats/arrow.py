"""pyarrow, the optional dependency of Parquet datasets: imported only when one is used.

``pip install 'mouthguard[parquet]'`` installs it. Nothing on the WebDataset
path imports this module's callers, so WebDataset datasets need no pyarrow
(``tests/data/test_arrow.py`` checks it in a fresh interpreter).
"""

from __future__ import annotations

from types import ModuleType

from mouthguard.errors import MissingDependencyError

PARQUET_EXTRA = "pip install 'mouthguard[parquet]'"


def pyarrow_modules() -> tuple[ModuleType, ModuleType]:
    """``(pyarrow, pyarrow.parquet)``.

    Raises:
        MissingDependencyError: pyarrow is not installed (one line saying what to install).
    """
    try:
        import pyarrow  # noqa: PLC0415 - the optional dependency, only when Parquet is used
        import pyarrow.parquet  # noqa: PLC0415
    except ImportError:
        raise MissingDependencyError(
            f"Parquet datasets need pyarrow, which is not installed: {PARQUET_EXTRA}"
        ) from None
    return pyarrow, pyarrow.parquet
