#!/usr/bin/env bash
# Checks a cuda-target engine wheel against the torch of a GPU machine without
# installing it: every symbol the module takes from torch's libraries must be
# defined by that torch (a C++ ABI mismatch shows here), then, where the
# machine's Python matches the wheel's tag, it installs and imports it.
#
#   ci/gpu-wheel-check.sh path/to/activekv-*.whl
set -euo pipefail
wheel=$1
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m zipfile -e "$wheel" "$work/wheel"
so=$(ls "$work"/wheel/activekv*.so)
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
"$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "accelerator", torch.accelerator.current_accelerator())'
readelf -d "$so" | grep -E "NEEDED|RUNPATH|RPATH"
nm -D --defined-only "$torch_lib"/libc10.so "$torch_lib"/libtorch_cpu.so "$torch_lib"/libtorch_python.so \
  | awk 'NF==3 {print $3}' | sort -u > "$work/defined"
# Undefined symbols of the module that torch's libraries are meant to provide (C++ names).
nm -D --undefined-only "$so" | awk '{print $2}' | grep -E '^_Z.*(3c10|2at|5torch|6caffe2)' | sort -u > "$work/wanted"
missing=$(comm -23 "$work/wanted" "$work/defined" | wc -l)
echo "symbols from torch: $(wc -l < "$work/wanted") wanted, $missing missing"
comm -23 "$work/wanted" "$work/defined" | head -20
[[ $missing -eq 0 ]] || { echo "ABI mismatch: the wheel needs symbols this torch lacks" >&2; exit 1; }
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
if [[ $(basename "$wheel") == *"-$tag-"* ]]; then
  "$python" -m pip install --no-deps --target "$work/site" "$wheel"
  PYTHONPATH="$work/site" "$python" -c 'import torch, activekv; print("imported", activekv.__file__)'
else
  echo "not installed: the wheel is not for this machine's Python ($tag)"
fi
