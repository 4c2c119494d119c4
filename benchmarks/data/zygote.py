"""Benchmark children forked from a process that has imported torch (``-m benchmarks.data.zygote``).

Protocol (see :class:`benchmarks.data.spawn.PreloadedChildren`): one JSON request
per line on stdin, ``{"module": NAME, "argv": [...], "env": {...}, "stdout": PATH,
"stderr": PATH}``;
for each, one line ``{"pid": N}`` as the child starts and one ``{"exit": CODE}``
as it ends (a negative code: killed by that signal). Requests are served one at a
time. End of stdin ends the zygote.

Only torch is imported here, and nothing of it is run: its thread pools start in
the child on first use, so a fork inherits no threads. The child starts its own
session, takes the request's environment, and runs the module as ``python -m
NAME ARGV`` would (:func:`runpy.run_module` as ``__main__``).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import traceback
from typing import Any, NoReturn

import torch  # noqa: F401 - the point of this process: every child inherits it imported


def _child(request: dict[str, Any]) -> NoReturn:
    """In the forked child: become ``python -m NAME ARGV``; never returns."""
    code = 1
    try:
        os.setsid()  # its own group: its DataLoader workers are killed with it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the zygote's requests are not the child's to read
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["module"], *request["argv"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # SystemExit("message"): what python prints, and exit 1
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - anything: reported as the child's failure
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


def serve() -> int:
    """Fork one child per request line until stdin ends."""
    replies = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
