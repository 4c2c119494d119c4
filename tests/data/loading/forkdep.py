"""Imported by :mod:`tests.data.loading.forkmain`: records which process imported it."""

from __future__ import annotations

import os

#: The process that imported (executed) this module.
IMPORTED_IN = os.getpid()
