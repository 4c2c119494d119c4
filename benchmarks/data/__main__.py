"""``python -m benchmarks.data``: see :mod:`benchmarks.data.run`."""

import sys

from benchmarks.data.run import main

sys.exit(main())
