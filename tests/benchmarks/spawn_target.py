"""A stand-in child for the launcher tests: ``python -m tests.benchmarks.spawn_target CMD [ARG]``.

``report`` prints what the child sees (as JSON); ``hang PIDFILE`` starts a grandchild
in its group, writes its pid, and sleeps; ``refuse`` exits with a message; ``crash``
raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "report":
        seen = {
            "argv": sys.argv[1:],
            "env": dict(os.environ),
            "own_session": os.getsid(0) == os.getpid(),
            "torch_imported": "torch" in sys.modules,
            "stdin": sys.stdin.read(),
        }
        print(json.dumps(seen), flush=True)
        print("a line on stderr", file=sys.stderr)
        return 0
    if command == "hang":
        grandchild = subprocess.Popen(["sleep", "600"])
        with open(args[0], "w") as pidfile:
            pidfile.write(str(grandchild.pid))
        time.sleep(600)
        return 0
    if command == "refuse":
        raise SystemExit("refused: why not")
    if command == "crash":
        raise RuntimeError("the child broke")
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
