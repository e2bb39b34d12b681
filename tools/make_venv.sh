#!/usr/bin/env bash
# Create a virtual environment with the first Python >= 3.12 found.
# Looks at $PYTHON, python3.13, python3.12, python3, then pyenv's versions.
set -euo pipefail
venv=${1:-.venv}
ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }
candidates=()
[ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
candidates+=(python3.13 python3.12 python3)
if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root)
    for v in $(ls -1 "$root/versions" 2>/dev/null | sort -rV); do
        candidates+=("$root/versions/$v/bin/python3")
    done
fi
for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && ok "$c"; then
        # pyenv shims answer for versions that are not selected; resolve them.
        exe=$("$c" -c 'import sys; print(sys.executable)')
        echo "make_venv: using $exe ($("$exe" --version))"
        "$exe" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        exit 0
    fi
done
echo "make_venv: no Python >= 3.12 found. Install one (e.g. 'pyenv install 3.12')" >&2
echo "           or point PYTHON=/path/to/python3.12 at it." >&2
exit 1
