#!/usr/bin/env bash
# Set up, then run the test suite on every core (pytest-xdist; arguments are passed to pytest).
# --fast: tests/unit and tests/integration only, the tests that start no process (no script run,
# no CLI subprocess, no Ray, S3 server or browser: `tests/tiers.py` refuses one there), about a
# minute on 2 cores; tests/e2e holds the rest.
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
exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup "$@"
