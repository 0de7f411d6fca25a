#!/usr/bin/env bash
# Set up, then run the test suite on every core (pytest-xdist; arguments are passed to pytest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -n auto --dist loadgroup "$@"
