#!/usr/bin/env bash
# Checks a cuda-target engine wheel, as the release publishes it, on a GPU
# machine: every symbol the module takes from torch's libraries must be
# defined by that machine's torch (a C++ ABI mismatch shows here); then it
# installs the wheel apart (pip --target, nothing else on the path) and runs
# the engine's device scenarios through the installed module on the
# accelerator (activekv.check_device: save and load bitwise, fences, a fence
# timeout's quarantine, streaming's ring), printing each. Any failure, a
# skipped scenario, no accelerator, or a wheel for another Python exits
# nonzero.
#
#   ci/gpu-wheel-check.sh path/to/activekv-*-cp312-*.whl     (PYTHON=python3, DEVICE=<default accelerator>)
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
if [[ $(basename "$wheel") != *"-$tag-"* ]]; then
  echo "no device check: the wheel is not for this machine's Python ($tag); pass the $tag wheel" >&2
  exit 2
fi
if "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m pip install --quiet --no-deps --no-index --target "$work/site" "$wheel"
else  # a binary-only wheel is its site-packages layout: unpacking it installs it
  "$python" -m zipfile -e "$wheel" "$work/site"
fi
PYTHONPATH="$work/site" "$python" - "$work/site" "${DEVICE:-}" <<'PY'
import importlib.metadata, os, sys
import torch, activekv

site, device = sys.argv[1], sys.argv[2] or None
if not activekv.__file__.startswith(site + os.sep):
    sys.exit(f"imported {activekv.__file__}, not the wheel installed in {site}")
print("activekv", importlib.metadata.version("activekv"), "from", os.path.basename(activekv.__file__))
if device is None and torch.accelerator.current_accelerator() is None:
    sys.exit("no accelerator in this torch or machine: the device check needs one (DEVICE=cpu to force)")
results = activekv.check_device(device)  # prints a line per scenario; raises on a failed one
skipped = [r["name"] for r in results if r["outcome"] != "passed"]
if skipped and (device or "").split(":")[0] != "cpu":
    sys.exit(f"scenarios not run on the accelerator: {', '.join(skipped)}")
print(f"device check: {len(results) - len(skipped)} of {len(results)} scenarios passed")
PY
