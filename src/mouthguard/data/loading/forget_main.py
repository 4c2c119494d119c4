"""Forgetting, in the fork server, the main module it imported by name; its imports stay.

:func:`~mouthguard.data.loading.loader.fork_server` has the fork server import a
main module run as ``python -m NAME`` under its own name, so that what it
imports (torch, the user's packages) is imported once, there, and every worker
forked from it finds it done. Each worker then runs the main module's top
level again as ``__mp_main__``, as multiprocessing always does; finding NAME
itself already in ``sys.modules``, ``runpy`` warned in every worker of every
epoch ("found in sys.modules ... this may result in unpredictable
behaviour"). :func:`forget_preloaded_main`, run by the server's last preload
(:mod:`~mouthguard.data.loading.preload_end`, after NAME is wholly imported:
NAME itself usually imports this package), removes NAME from the server's
``sys.modules``: the workers run it afresh, as without the preload, with its
imports still done. Importing this module does nothing.
"""

from __future__ import annotations

import os
import sys

#: The environment variable through which the loader names the preloaded main module.
MAIN_ENV = "MOUTHGUARD_FORKSERVER_MAIN"


def forget_preloaded_main() -> str | None:
    """Remove the named main module from ``sys.modules`` here; its name, or None if not done.

    Only where NAME is not this process's own main module (the fork server's
    ``__main__`` is multiprocessing's, run with ``-c``).
    """
    name = os.environ.get(MAIN_ENV)
    main = sys.modules.get("__main__")
    if not name or getattr(getattr(main, "__spec__", None), "name", None) == name:
        return None  # nothing named, or this is the program itself: leave it be
    return name if sys.modules.pop(name, None) is not None else None
