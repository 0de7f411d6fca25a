#!/usr/bin/env bash
# Creates .venv (if missing) and installs trainadvisor with its test tools into it.
# Sourced by scripts/demo.sh and scripts/test.sh; needs only python3.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
stamp="$venv/.trainadvisor-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # torch is pinned here (not in pyproject.toml, which accepts torch>=2.1) so that set-up takes
    # the CPU build of 2.13.0 instead of downloading a multi-GB CUDA build.
    "$venv/bin/python" -m pip install --quiet "torch==2.13.0" numpy
    "$venv/bin/python" -m pip install --quiet -e "$root[dev]"
    touch "$stamp"
fi
# The package's bytecode, compiled now (only what changed since): an editable install leaves none,
# and where PYTHONDONTWRITEBYTECODE is set no process writes it, so every process that imports
# trainadvisor (each CLI call, each run's child) compiled it anew: about 1 s a CLI call on 2 cores.
"$venv/bin/python" -m compileall -q "$root/trainadvisor"
