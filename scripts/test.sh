#!/usr/bin/env bash
# Set up (if needed) and run the default test suite: fast, offline, no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two pytest workers (pytest-xdist): much of the suite waits on subprocesses, servers and Ray, so on the
# 2-core CI machine two processes take 10 min where one took 17. `bash scripts/test.sh -n 0` runs one, `-n 4` four.
exec .venv/bin/python -m pytest -n 2 "$@"
