#!/usr/bin/env bash
# Installs the Python package as a user would: `pip install .` (pyproject.toml,
# scikit-build-core building the extension and the tool with CMake) into a
# throw-away virtual environment of the python3 on PATH, then imports it from
# outside the source tree and checks its version against CMakeLists.txt and
# that the `mha` command runs. Nothing outside the temporary folder changes
# (the build folder build-python/ is kept, so a second run rebuilds only
# what changed).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON_FOR_INSTALL:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mha-python-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

version=$(sed -n 's/^project(mha VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
"$python" -m venv "$tmp/venv"
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check . \
  > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; exit 1; }

cd "$tmp"   # away from the source tree, so only the installed package can be found
got=$("$tmp/venv/bin/python" - <<'PY'
import pathlib, sys
import numpy as np
import mha
assert "site-packages" in pathlib.Path(mha.__file__).parts, mha.__file__
# The d2l chapter's check.
attention = mha.MultiHeadAttention(100, 5, 0.5)
X, Y = np.ones((2, 4, 100), np.float32), np.ones((2, 6, 100), np.float32)
out = attention(X, Y, Y, np.array([3, 2]))
assert out.shape == (2, 4, 100), out.shape
print(mha.__version__)
PY
)
[ "$got" = "$version" ] || { echo "check-python-install: mha.__version__ is '$got', wanted '$version'" >&2; exit 1; }
pip_version=$("$tmp/venv/bin/python" -m pip show mha | sed -n 's/^Version: //p')
[ "$pip_version" = "$version" ] || { echo "check-python-install: pip sees version '$pip_version', wanted '$version'" >&2; exit 1; }
# The `mha` command comes with the package (console entry point -> mha/_bin/mha).
tool=$("$tmp/venv/bin/mha" --version)
[ "$tool" = "mha $version" ] || { echo "check-python-install: the installed 'mha --version' printed '$tool', wanted 'mha $version'" >&2; exit 1; }
echo "check-python-install: ok (pip install . into a venv; import mha from $tmp gives $got; the mha command runs)"
