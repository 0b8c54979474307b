#!/usr/bin/env bash
# The engine on a machine with an accelerator and torch (no vLLM needed): build
# the C++ tests and the transfer benchmark against that machine's torch, run
# the tests (the accelerator ones included), then the benchmark.
#
#   ci/gpu-engine-check.sh [GOOGLETEST_SOURCE_DIR]
#
# GoogleTest comes from the system (libgtest-dev) or, on a machine that cannot
# install packages, from a GoogleTest source tree given as the argument.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-engine-check}
mkdir -p "$out"
python=${PYTHON:-python3}
prefix=()
if [[ $# -ge 1 ]]; then
  cmake -S "$1" -B build/gtest -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=build/gtest-install >/dev/null 2>&1
  cmake --build build/gtest --target install >/dev/null
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/build/gtest-install")
fi
"$python" -c 'import torch; print("torch", torch.__version__, "accelerator", torch.accelerator.current_accelerator())'
cmake -S engine -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTIVEKV_WERROR=ON \
  -DACTIVEKV_BUILD_PYTHON=OFF -DACTIVEKV_BUILD_TESTS=ON -DACTIVEKV_BUILD_BENCH=ON \
  -DPython_EXECUTABLE="$(command -v "$python")" "${prefix[@]}" >/dev/null 2>&1
cmake --build build/gpu >/dev/null
ctest --test-dir build/gpu --output-on-failure 2>&1 | tee "$out/ctest.txt"
# A skipped accelerator test means no accelerator was found: that is a failure here.
if grep -q "Skipped" "$out/ctest.txt"; then echo "accelerator tests were skipped" >&2; exit 1; fi
for shape in "2048 4" "512 32" "8192 4"; do
  set -- $shape
  build/gpu/transfer_bench --blocks "$1" --layers "$2" --iters 10 | tee -a "$out/bench.txt"
done
