#!/usr/bin/env bash
# Installs the CMake build in $1 (default: build) into a temporary prefix and
# uses it as a user would: builds examples/consumer with find_package(mha),
# builds the same program and the README's C++ block with pkg-config, and
# runs them and the installed `mha --version`. Nothing outside the temporary folder is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mha-install-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

version=$(sed -n 's/^project(mha VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "check-install: no version in CMakeLists.txt" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log"
echo "check-install: installed $(find "$prefix" -type f | wc -l) files into a temporary prefix"

# 1. CMake: find_package(mha 0.1 REQUIRED), targets mha::mha and mha::plot.
cmake -S examples/consumer -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/consumer-configure.log"
cmake --build "$tmp/consumer" -j"${JOBS:-2}" > "$tmp/consumer-build.log"
"$tmp/consumer/seed_check"
"$tmp/consumer/plot_check"
# mha::dist, when this build has it (MPI found): the consumer's ring attention on 2 ranks.
if [ -f "$prefix/lib/cmake/mha/mhaDistTargets.cmake" ] || [ -n "$(find "$prefix" -name mhaDistTargets.cmake)" ]; then
  [ -x "$tmp/consumer/dist_check" ] || { echo "check-install: mha::dist is installed but the consumer did not find it" >&2; exit 1; }
  mpirun --allow-run-as-root --oversubscribe -np 2 "$tmp/consumer/dist_check"
  echo "check-install: mha::dist links from the package and runs under mpirun"
fi

# 2. pkg-config, with the same source.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion mha)" = "$version" ] || { echo "check-install: pkg-config version $(pkg-config --modversion mha) is not $version" >&2; exit 1; }
# shellcheck disable=SC2046
c++ -std=c++20 -O1 examples/consumer/seed_check.cpp -o "$tmp/seed_check_pc" $(pkg-config --cflags --libs mha)
LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/seed_check_pc"   # a shared libmha in a private prefix

# 3. The README's C++ block, as a user would paste it: its includes, then its
# statements inside main(), built with pkg-config and run in a scratch folder.
awk '/^## C\+\+/{c=1} c && /^```cpp/{f=1; next} f && /^```/{exit} f' README.md > "$tmp/readme_block.cpp"
[ -s "$tmp/readme_block.cpp" ] || { echo "check-install: no C++ block under README's '## C++'" >&2; exit 1; }
{ grep '^#include' "$tmp/readme_block.cpp"; echo 'int main() {'; grep -v '^#include' "$tmp/readme_block.cpp"; echo '}'; } \
  > "$tmp/readme_main.cpp"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 "$tmp/readme_main.cpp" -o "$tmp/readme_main" $(pkg-config --cflags --libs mha)
(cd "$tmp" && LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ./readme_main)
[ -s "$tmp/w.safetensors" ] || { echo "check-install: the README's C++ block wrote no w.safetensors" >&2; exit 1; }
echo "check-install: the README's C++ block builds and runs"

# 4. The installed tool.
got=$("$prefix/bin/mha" --version)
[ "$got" = "mha $version" ] || { echo "check-install: 'mha --version' printed '$got', wanted 'mha $version'" >&2; exit 1; }

# 4. Every installed public header, included by a consumer that builds with
# strict warnings as errors: mha's headers add no warning to the user's build.
find "$prefix/include/mha" -name '*.h' ! -path '*/detail/*' | sort | sed 's|.*/include/|#include "|; s|$|"|' > "$tmp/all_headers.cpp"
echo 'int main() { return 0; }' >> "$tmp/all_headers.cpp"
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Wextra -Wshadow -Wconversion -Werror -fsyntax-only "$tmp/all_headers.cpp" $(pkg-config --cflags mha)
echo "check-install: every public header builds under -Wall -Wextra -Wshadow -Wconversion -Werror"
echo "check-install: ok (CMake package, pkg-config and tool, version $version)"
