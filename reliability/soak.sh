#!/usr/bin/env bash
# The long versions of every reliability harness: `python -m reliability.run --level soak`.
#
# Bounded: each harness stops by itself (the crash harness after its 400 kills,
# roughly 10-30 minutes on a 2-core machine, depending on load: 150 kills took 4 minutes
# on an idle one, 100 took 7.5 on a busy one), the others
# by their own soak budgets; `timeout` ends the whole run after 3 hours whatever
# happens. Expect about an hour in all. Extra arguments go to the runner, e.g.
# `--only crash` or `--json-dir DIR`.
# Exit status: the runner's (1 if any case did not survive; 3 if none failed but a
# harness did not run, e.g. s3_faults without an S3 server), 124 on the timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout --signal=INT --kill-after=60 3h .venv/bin/python -m reliability.run --level soak "$@"
