#!/usr/bin/env bash
# ActiveKV inside real vLLM on a CUDA GPU: installs the cuda engine (the
# release's cp312 wheel, or ./engine built here with --engine-source), vLLM
# 0.26.0 (the wheel pinned in packaging/vllm-distributions.toml, patched with
# patches/vllm/0.26.0/ here, or the patch stage's patched wheel) and what the
# machine lacks (packaging/cuda/gpu-vllm-requirements.txt, wheels from --deps),
# each apart from the machine's own packages (pip --target, --no-index), then
# runs tests/gpu (pytest -m gpu): exact, compressed, decode saves and layer
# streaming, bit for bit vLLM's own answers, in compiled and eager mode, and
# the refusals (a bad extra config; streaming on the unpatched vLLM).
#
#   ci/gpu-vllm-check.sh --engine WHEEL|--engine-source --vllm VLLM_WHEEL --deps DIR [-- PYTEST_ARGS]
#   ci/gpu-vllm-check.sh --fetch DIR        (with network) download the wheels --deps needs
#
# WORK=dir keeps the installs between runs (default: a temporary folder).
# Exits nonzero on a failed test, a wheel of other bytes, or no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
requirements=packaging/cuda/gpu-vllm-requirements.txt
version=0.26.0
engine= vllm_wheel= deps= pytest_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --engine) engine=$2; shift 2 ;;
    --engine-source) engine=source; shift ;;
    --vllm) vllm_wheel=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    --fetch)
      exec "$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
        --require-hashes -r "$requirements" -d "$2" ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
[[ -n $engine && -n $vllm_wheel && -n $deps ]] || {
  echo "usage: $0 --engine WHEEL|--engine-source --vllm VLLM_WHEEL --deps DIR [-- PYTEST_ARGS]" >&2; exit 2; }
if [[ -z ${WORK:-} ]]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK"
"$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'

echo "+ dependencies ($requirements)"
if [[ ! -d $WORK/deps ]]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/deps.tmp" \
    --find-links "$deps" --require-hashes -r "$requirements"
  mv "$WORK/deps.tmp" "$WORK/deps"
fi

echo "+ vLLM $version ($(basename "$vllm_wheel"))"
series=$(grep -v '^#' "patches/vllm/$version/series" | sed '/^$/d')
if [[ ! -d $WORK/vllm ]]; then
  rm -rf "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
  "$python" -m zipfile -e "$vllm_wheel" "$WORK/vllm.tmp"
  if [[ $(basename "$vllm_wheel") == vllm-$version-* ]]; then
    # The pinned wheel, exactly: then the series, as the patch stage applies it.
    want=$("$python" -c 'import sys, tomllib; print(next(d["sha256"] for d in tomllib.load(open(sys.argv[1], "rb"))["distribution"] if d["name"] == "vllm" and d["version"] == sys.argv[2]))' packaging/vllm-distributions.toml "$version")
    got=$(sha256sum "$vllm_wheel" | cut -d' ' -f1)
    [[ $got == "$want" ]] || { echo "$vllm_wheel: sha256 $got, pinned $want" >&2; exit 3; }
    cp -a "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
    for p in $series; do patch -p1 -F0 --no-backup-if-mismatch -s -d "$WORK/vllm.tmp" < "patches/vllm/$version/$p"; done
  else  # the patch stage's patched wheel: the unpatched tree is the series taken back out
    cp -a "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
    for p in $(echo "$series" | tac); do patch -R -p1 -F0 --no-backup-if-mismatch -s -d "$WORK/vllm-unpatched" < "patches/vllm/$version/$p"; done
  fi
  mv "$WORK/vllm.tmp" "$WORK/vllm"
fi

echo "+ engine ($engine)"
if [[ $engine == source && -d $WORK/engine ]]; then
  echo "  (kept from an earlier run in WORK)"
elif [[ $engine == source ]]; then
  "$python" -m pip install -q --no-build-isolation --no-deps --no-index --target "$WORK/engine" ./engine
elif rm -rf "$WORK/engine" && "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m pip install -q --no-deps --no-index --target "$WORK/engine" "$engine"
else  # a binary-only wheel is its site-packages layout: unpacking it installs it
  "$python" -m zipfile -e "$engine" "$WORK/engine"
fi

export PYTHONPATH="$WORK/engine:$WORK/vllm:$WORK/deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ACTIVEKV_UNPATCHED_VLLM="$WORK/vllm-unpatched" ACTIVEKV_TEST_CACHE="$WORK/cache"
"$python" -c 'import torch, activekv, vllm; from vllm import LLM; print("activekv from", activekv.__file__); print("vllm", vllm.__version__, "offers", activekv.vllm_features())'
# vLLM and its dependencies warn at import on this stack: the warnings are not ours to fail on.
exec "$python" -m pytest -m gpu tests/gpu -o filterwarnings=default -ra "${pytest_args[@]}"
