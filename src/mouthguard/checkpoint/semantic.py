"""Deprecated: renamed :mod:`mouthguard.checkpoint.checking` (the check contract, the verdicts).

``Check`` and ``CheckInput``, the types a check of your own takes, are
importable from :mod:`mouthguard.checks`. This module re-exports them, with a
:class:`DeprecationWarning`, for one release.
"""

from __future__ import annotations

import warnings

from mouthguard.checkpoint.checking import Check, CheckInput

__all__ = ["Check", "CheckInput"]

warnings.warn(
    "mouthguard.checkpoint.semantic is deprecated; import Check and CheckInput "
    "from mouthguard.checks",
    DeprecationWarning,
    stacklevel=2,
)
