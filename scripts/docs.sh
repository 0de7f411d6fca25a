#!/usr/bin/env bash
# The docs: the generated pages checked against the code, then the site built with mkdocs
# --strict into site/ (a warning fails it); --serve: serve it at 127.0.0.1:8000 while you write.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
cd "$root"
export NO_MKDOCS_2_WARNING=1
"$root/.venv/bin/python" scripts/gen_docs.py --check
if [ "${1:-}" = "--serve" ]; then
    exec "$root/.venv/bin/mkdocs" serve --strict
fi
"$root/.venv/bin/mkdocs" build --strict --quiet --site-dir "$root/site"
echo "docs: built into site/"
