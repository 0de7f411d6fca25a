#!/usr/bin/env bash
# Set up, then run the test suite in parallel (pytest-xdist; arguments are passed to pytest).
# --fast: tests/unit and tests/integration only, the tests that start no process (no script run,
# no CLI subprocess, no Ray, S3 server or browser: `tests/tiers.py` refuses one there), about a
# minute on 2 cores, one worker a core (they compute all the time); tests/e2e holds the rest.
# The whole suite runs one worker more than the cores: the e2e tests' processes wait (on their
# scripts' sleeps, on sockets, on children starting) about a sixth of the time, measured on 2
# cores (20.5 CPU-minutes of the 24.7 that 2 workers' 12m20s offered; 3 workers: 10m47s).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
if [ "${1:-}" = "--fast" ]; then
    shift
    # the two fast folders, unless the arguments name tests of their own
    for arg in "$@"; do
        if [ -e "${arg%%::*}" ]; then
            exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup "$@"
        fi
    done
    exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup "$@" tests/unit tests/integration
fi
workers=$(( $(nproc) + 1 ))  # the cores this process may use, as pytest -n auto counts them here
exec "$root/.venv/bin/python" -m pytest -n "$workers" --dist loadgroup "$@"
