"""Run as ``python -m tests.data.loading.forkmain``: which process imported this module.

The test of :func:`mouthguard.data.loading.loader.fork_server` runs it in a child
process: it starts the fork server as a loader would, forks one worker from it,
and prints (as JSON) its own pid, the worker's, the pid of the process that
imported what this module imports (:mod:`tests.data.loading.forkdep`) -- the fork
server, when it preloaded the main module, or the worker itself when it had to
import it again -- and whether the worker found this module under its own name
(it should not: the fork server forgets it, :mod:`mouthguard.data.loading.forget_main`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# At the top, as a training script does: the preload imports the loader while
# importing this module (the fork server must not forget it half-imported).
from mouthguard.data.loading.forget_main import MAIN_ENV
from mouthguard.data.loading.loader import fork_server, start_fork_server
from tests.data.loading import forkdep

NAME = "tests.data.loading.forkmain"


def report(queue: Any) -> None:
    """In a worker: its pid, where its main module's import was done, and whether NAME is known."""
    queue.put((os.getpid(), forkdep.IMPORTED_IN, NAME in sys.modules))


def main() -> None:
    context = fork_server()
    start_fork_server(context)
    left = MAIN_ENV in os.environ  # read by the server at its start, then removed here
    queue = context.Queue()  # type: ignore[attr-defined]
    worker = context.Process(target=report, args=(queue,))  # type: ignore[attr-defined]
    worker.start()
    pid, imported_in, named = queue.get(timeout=120)
    worker.join(120)
    print(
        json.dumps(
            {
                "parent": os.getpid(),
                "worker": pid,
                "imported_in": imported_in,
                "named": named,
                "env_left": left,
            }
        )
    )


if __name__ == "__main__":
    main()
