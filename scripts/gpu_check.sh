#!/usr/bin/env bash
# Check trainadvisor on a machine with an NVIDIA GPU: profile every example, check each report,
# print a table (scripts/gpu_check.py). Uses the Python given as $PYTHON (default python3), which
# must have a CUDA build of torch: the project's .venv holds the CPU build and cannot see a GPU.
#
#     bash scripts/gpu_check.sh [--out DIR] [--only NAME] [--record-traces]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "gpu_check: $py has no torch; install a CUDA build of torch there (or set PYTHON)" >&2
    exit 2
fi
# trainadvisor and its small dependencies, into that Python (torch is left as it is)
"$py" -m pip install --quiet -e "$root"
cd "$root"
exec "$py" scripts/gpu_check.py "$@"
