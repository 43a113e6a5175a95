#!/usr/bin/env bash
# Installs the Python package with Debian's pip, as a user would, into a
# throw-away virtual environment that sees Debian's numpy
# (--system-site-packages), then imports it from outside the source tree and
# checks its version against CMakeLists.txt. The system Python is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mha-python-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

version=$(sed -n 's/^project(mha VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
"$python" -m venv --system-site-packages "$tmp/venv"
# --no-index: no package index is reachable; setuptools and wheel come from Debian.
"$tmp/venv/bin/pip" install --no-index --quiet . > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log" >&2; exit 1; }

cd "$tmp"   # away from the source tree, so only the installed package can be found
got=$("$tmp/venv/bin/python" - <<'PY'
import pathlib, sys
import numpy as np
import mha
assert "site-packages" in pathlib.Path(mha.__file__).parts, mha.__file__
# The seed's check.
attention = mha.MultiHeadAttention(100, 5, 0.5)
X, Y = np.ones((2, 4, 100), np.float32), np.ones((2, 6, 100), np.float32)
out = attention(X, Y, Y, np.array([3, 2]))
assert out.shape == (2, 4, 100), out.shape
print(mha.__version__)
PY
)
[ "$got" = "$version" ] || { echo "check-python-install: mha.__version__ is '$got', wanted '$version'" >&2; exit 1; }
pip_version=$("$tmp/venv/bin/pip" show mha | sed -n 's/^Version: //p')
[ "$pip_version" = "$version" ] || { echo "check-python-install: pip sees version '$pip_version', wanted '$version'" >&2; exit 1; }
# The `mha` command comes with the package (console entry point -> mha/_bin/mha).
tool=$("$tmp/venv/bin/mha" --version)
[ "$tool" = "mha $version" ] || { echo "check-python-install: the installed 'mha --version' printed '$tool', wanted 'mha $version'" >&2; exit 1; }
echo "check-python-install: ok (pip install . into a venv; import mha from $tmp gives $got; the mha command runs)"
