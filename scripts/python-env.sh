#!/usr/bin/env bash
# Makes the virtual environment of the torch 2.x line (torch 2.13 CPU build,
# numpy 2, pybind11 3, transformers, ONNX Runtime: requirements/torch2.txt)
# with the python3 on PATH, only when it is missing or the requirements
# changed. Used by `make demo` and `make test` (and so by CI): the Python
# extension is built with this environment's pybind11 (numpy 2 needs >= 2.12;
# Debian 12's is 2.10), and the Python tests run in it and in Debian's Python
# with Debian's torch 1.13.
#   scripts/python-env.sh [VENV]   (default build-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build-venv}
req=requirements/torch2.txt
python=${MHA_VENV_PYTHON:-python3}
stamp="$venv/.requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
echo "python-env: making $venv from $req with $($python --version 2>&1)"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
