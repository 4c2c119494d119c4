"""Run as ``python -m tests.data.loading.forkmain``: which process imported this module.

The test of :func:`mouthguard.data.loading.loader.fork_server` runs it in a child
process: it starts the fork server as a loader would, forks one worker from it,
and prints (as JSON) its own pid, the worker's, and the pid of the process that
imported this module under its own name -- the fork server, when it preloaded
the main module, or none at all when every worker had to import it again.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: The process that imported (executed) this module under its own name.
IMPORTED_IN = os.getpid()
NAME = "tests.data.loading.forkmain"


def report(queue: Any) -> None:
    """In a worker: its pid, and where the module under its own name was imported (or None)."""
    module = sys.modules.get(NAME)
    queue.put((os.getpid(), None if module is None else module.IMPORTED_IN))


def main() -> None:
    from mouthguard.data.loading.loader import fork_server, start_fork_server  # noqa: PLC0415

    context = fork_server()
    start_fork_server(context)
    queue = context.Queue()  # type: ignore[attr-defined]
    worker = context.Process(target=report, args=(queue,))  # type: ignore[attr-defined]
    worker.start()
    pid, imported_in = queue.get(timeout=120)
    worker.join(120)
    print(json.dumps({"parent": os.getpid(), "worker": pid, "imported_in": imported_in}))


if __name__ == "__main__":
    main()
