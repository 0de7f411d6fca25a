#!/usr/bin/env bash
# Set up, then profile the bundled slow-input example and write ./trainadvisor-report/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
"$root/.venv/bin/trainadvisor" profile --out "${1:-trainadvisor-report}" \
    "$root/examples/slow_input_mnist.py" --epochs 1
