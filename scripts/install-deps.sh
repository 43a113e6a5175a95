#!/usr/bin/env bash
# Installs the Debian 12 packages mha needs, only those missing.
# Used by `make demo` and `make test` (and so by CI); safe to run again.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev           # the BLAS for mha and, through libblas.so.3, for PyTorch
  libgtest-dev googletest   # C++ tests
  nlohmann-json3-dev        # safetensors headers
  libcli11-dev              # the tool's argument parser
  libcairo2-dev             # PNG heatmaps and plots
  fonts-dejavu-core         # the font the plots' text is set in
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-setuptools python3-wheel python3-pip python3-venv   # pip install . (offline)
  doxygen                   # make docs: the API reference
  clang libclang-rt-dev     # sanitizer builds and libFuzzer (make test-asan/-tsan/-fuzz)
  libomp-dev                # clang's OpenMP, with the Archer tool TSan needs
  libopenmpi-dev openmpi-bin   # mha::dist (multi-process attention) and its tests under mpirun
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyTorch must use OpenBLAS too, or every comparison with it is against the
# slow reference BLAS: point libblas.so.3 at OpenBLAS if it points elsewhere.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
  *openblas*) ;;
  *)
    alt=$(ls /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 2>/dev/null || true)
    if [ -n "$alt" ]; then
      SUDO=""
      [ "$(id -u)" -ne 0 ] && SUDO="sudo"
      $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt"
    fi
    ;;
esac
