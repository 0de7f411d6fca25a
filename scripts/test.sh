#!/usr/bin/env bash
# Set up, then run the test suite on every core (pytest-xdist; arguments are passed to pytest).
# --fast: only the tests that start no process (no script run, no CLI subprocess, no Ray, S3
# server or browser: `tests/tiers.py` reads it from their code), about a minute on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
if [ "${1:-}" = "--fast" ]; then
    shift
    exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup -m "not e2e" "$@"
fi
exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup "$@"
