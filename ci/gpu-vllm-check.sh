#!/usr/bin/env bash
# ActiveKV inside real vLLM on a CUDA GPU: installs the cuda engine (the
# release's cp312 wheel, or ./engine built here with --engine-source), vLLM
# (0.26.0 unless --vllm-version or VLLM_VERSION names another: the wheel pinned
# in packaging/vllm-distributions.toml, patched with patches/vllm/<version>/
# here, or the patch stage's patched wheel) and what the machine lacks for that
# vLLM (the version's list in packaging/cuda/, wheels from --deps), each apart
# from the machine's own packages (pip --target, --no-index), then runs
# tests/gpu (pytest -m gpu): exact, compressed, decode saves and layer
# streaming, bit for bit vLLM's own answers, in compiled and eager mode, and
# the refusals (a bad extra config; streaming on the unpatched vLLM).
#
#   ci/gpu-vllm-check.sh [--vllm-version V] --engine WHEEL|--engine-source --vllm VLLM_WHEEL --deps DIR [-- PYTEST_ARGS]
#   ci/gpu-vllm-check.sh [--vllm-version V] --fetch DIR    (with network) download the wheels --deps needs
#
# The lists: 0.26.0 packaging/cuda/gpu-vllm-requirements.txt (the machine's own
# torch 2.11.0); another version packaging/cuda/gpu-vllm-<version>-requirements.txt.
# A list that carries a torch (0.34.0: torch 2.14.0, its triton and NCCL) puts
# it before the machine's on PYTHONPATH before the engine is built, so that the
# engine is compiled against the torch vLLM runs on; the check prints which
# torch and which CUDA libraries it loaded.
# LMCACHE=1 (vLLM 0.26.0 only): LMCache as well, for the served benchmark's
# `lmcache` engine: packaging/cuda/gpu-lmcache-requirements.txt's wheels, fetched
# with vLLM's list into the same DIR and installed from --deps into WORK/lmcache,
# on PYTHONPATH after vLLM's dependencies; its connector is imported before the
# tests, and the PYTHONPATH printed for later runs (keep WORK).
# WORK=dir keeps the installs between runs (default: a temporary folder); one
# WORK serves one vLLM version. PINS: the distributions file (default
# packaging/vllm-distributions.toml). PATCHES: the series' folder (default
# patches/vllm).
# Exits nonzero on a failed test, a wheel of other bytes, or no CUDA device.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$here/$1"; }  # as the caller named it
python=${PYTHON:-python3}
version=${VLLM_VERSION:-0.26.0}
pins=$(absolute "${PINS:-$PWD/packaging/vllm-distributions.toml}")
patches=$(absolute "${PATCHES:-$PWD/patches/vllm}")
outer=${PYTHONPATH:-}  # the caller's, kept behind ours
engine= vllm_wheel= deps= fetch= pytest_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --vllm-version) version=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    --engine-source) engine=source; shift ;;
    --vllm) vllm_wheel=$2; shift 2 ;;
    --deps) deps=$2; shift 2 ;;
    --fetch) fetch=$2; shift 2 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
if [[ $version == 0.26.0 ]]; then
  requirements=packaging/cuda/gpu-vllm-requirements.txt
else
  requirements=packaging/cuda/gpu-vllm-$version-requirements.txt
fi
[[ -f $requirements ]] || {
  echo "no list of the wheels vLLM $version needs on the GPU machine: $requirements is missing" >&2; exit 3; }
lists=(-r "$requirements")
lmcache=${LMCACHE:-0}  # anything but 0 or empty
[[ $lmcache == 0 ]] && lmcache=
lmcache_list=packaging/cuda/gpu-lmcache-requirements.txt
if [[ -n $lmcache ]]; then
  [[ $version == 0.26.0 ]] || {
    echo "LMCACHE=1: LMCache's wheels ($lmcache_list) are resolved for vLLM 0.26.0 only, not $version" >&2; exit 3; }
  lists+=(-r "$lmcache_list")
fi
if [[ -n $fetch ]]; then
  exec "$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_18_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    --require-hashes "${lists[@]}" -d "$fetch"
fi
[[ -n $engine && -n $vllm_wheel && -n $deps ]] || {
  echo "usage: $0 [--vllm-version V] --engine WHEEL|--engine-source --vllm VLLM_WHEEL --deps DIR [-- PYTEST_ARGS]" >&2; exit 2; }
# Before anything is installed: the version's patch series, and every patch it names.
[[ -f $patches/$version/series ]] || {
  echo "no patch series for vLLM $version: $patches/$version/series is missing (none written yet for this version?)" >&2
  exit 3
}
series=$(grep -v '^#' "$patches/$version/series" | sed '/^$/d' || true)
for p in $series; do
  [[ -f $patches/$version/$p ]] || { echo "$patches/$version/series names $p, which is not there" >&2; exit 3; }
done
if [[ -z ${WORK:-} ]]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK"
if [[ -f $WORK/vllm-version && $(cat "$WORK/vllm-version") != "$version" ]]; then
  echo "WORK ($WORK) holds the installs for vLLM $(cat "$WORK/vllm-version"), not $version: name another WORK" >&2
  exit 3
fi
echo "$version" > "$WORK/vllm-version"
"$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'

echo "+ dependencies ($requirements)"
if [[ ! -d $WORK/deps ]]; then
  rm -rf "$WORK/deps.tmp"
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/deps.tmp" \
    --find-links "$deps" --require-hashes -r "$requirements"
  mv "$WORK/deps.tmp" "$WORK/deps"
fi
if [[ -n $lmcache ]]; then
  echo "+ LMCache ($lmcache_list)"
  if [[ ! -d $WORK/lmcache ]]; then  # a folder of its own: a WORK without it gains it
    rm -rf "$WORK/lmcache.tmp"
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/lmcache.tmp" \
      --find-links "$deps" --require-hashes -r "$lmcache_list"
    rm -rf "$WORK/lmcache.tmp/tests"  # cufile-python's top-level tests: not to shadow ours on PYTHONPATH
    mv "$WORK/lmcache.tmp" "$WORK/lmcache"
  fi
fi
if [[ -d $WORK/deps/torch ]]; then
  # A torch of the list's own (and the CUDA libraries carried beside it, found
  # first by torch's rpath and preload): before the machine's, from here on,
  # the engine's build included. The machine's CUDA libraries that were not
  # carried are linked in beside it, so that torch's rpath ($ORIGIN/../../nvidia/...)
  # and its preload (sys.path) find the same files: one libcudart, not the
  # system's beside the wheel's.
  machine_nvidia=$("$python" -c 'import os, sys
print(next((os.path.join(p, "nvidia") for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))), ""))')
  mkdir -p "$WORK/deps/nvidia"
  if [[ -n $machine_nvidia ]]; then
    for lib in "$machine_nvidia"/*/; do
      lib=${lib%/}
      [[ ${lib##*/} == __* || -e $WORK/deps/nvidia/${lib##*/} ]] || ln -s "$lib" "$WORK/deps/nvidia/${lib##*/}"
    done
  fi
  export PYTHONPATH="$WORK/deps${outer:+:$outer}"
  # scikit-build-core puts the machine's site-packages on CMAKE_PREFIX_PATH ahead
  # of the engine's own entry: name this torch's CMake package outright.
  export SKBUILD_CMAKE_DEFINE="Torch_DIR=$WORK/deps/torch/share/cmake/Torch${SKBUILD_CMAKE_DEFINE:+;$SKBUILD_CMAKE_DEFINE}"
  echo "+ torch from $WORK/deps, before the machine's"
  torch_info=$("$python" -c '
import torch
print("torch", torch.__version__, "from", torch.__file__, "cuda", torch.version.cuda, flush=True)
print("nccl", ".".join(map(str, torch.cuda.nccl.version())), flush=True)
c = torch._C._cudnn
run, built = c.getRuntimeVersion(), c.getCompileVersion()
print("cudnn runtime", ".".join(map(str, run)), "built against", ".".join(map(str, built)), flush=True)
libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
               if any(k in line for k in ("libnccl", "libcudnn.so", "libcusparseLt", "libnvshmem_host", "libcudart", "libcublas.so"))})
print("loaded", *libs, sep="\n  ", flush=True)
if run[:2] < built[:2]:
    print("CUDNN_OLDER")
')
  grep -v '^CUDNN_OLDER$' <<< "$torch_info" || true
  if [[ $torch_info == *CUDNN_OLDER* && -z ${PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK:-} ]]; then
    # torch refuses an older cuDNN minor at its first cuDNN call (torch.backends.cudnn._init),
    # though it loads and runs it; no cuDNN call is known on vLLM's Llama path.
    echo "  the machine's cuDNN is older than torch's: PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1" \
      "(carry nvidia-cudnn-cu13, packaging/cuda/gpu-torch-2.14-cuda-libs.txt, where a test needs it)"
    export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
  fi
fi

echo "+ vLLM $version ($(basename "$vllm_wheel"))"
if [[ ! -d $WORK/vllm ]]; then
  rm -rf "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
  "$python" -m zipfile -e "$vllm_wheel" "$WORK/vllm.tmp"
  if [[ $(basename "$vllm_wheel") == vllm-$version-* ]]; then
    # The pinned wheel, exactly: then the series, as the patch stage applies it.
    want=$("$python" -c 'import sys, tomllib; print(next(d["sha256"] for d in tomllib.load(open(sys.argv[1], "rb"))["distribution"] if d["name"] == "vllm" and d["version"] == sys.argv[2]))' "$pins" "$version") || {
      echo "no vllm $version sha256 read from $pins" >&2; exit 3; }
    got=$(sha256sum "$vllm_wheel" | cut -d' ' -f1)
    [[ $got == "$want" ]] || { echo "$vllm_wheel: sha256 $got, pinned $want" >&2; exit 3; }
    cp -a "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
    for p in $series; do patch -p1 -F0 --no-backup-if-mismatch -s -d "$WORK/vllm.tmp" < "$patches/$version/$p"; done
  else  # the patch stage's patched wheel: the unpatched tree is the series taken back out
    cp -a "$WORK/vllm.tmp" "$WORK/vllm-unpatched"
    for p in $(echo "$series" | tac); do patch -R -p1 -F0 --no-backup-if-mismatch -s -d "$WORK/vllm-unpatched" < "$patches/$version/$p"; done
  fi
  mv "$WORK/vllm.tmp" "$WORK/vllm"
fi

echo "+ engine ($engine)"
if [[ $engine == source && -d $WORK/engine ]]; then
  echo "  (kept from an earlier run in WORK)"
elif [[ $engine == source ]]; then
  rm -rf "$WORK/engine.tmp"
  "$python" -m pip install -q --no-build-isolation --no-deps --no-index --target "$WORK/engine.tmp" ./engine
  if [[ -d $WORK/deps/torch ]]; then  # built against the carried torch, or refused
    carried=$(cd "$WORK/deps" && ls -d torch-*.dist-info)
    carried=${carried#torch-}
    carried=${carried%.dist-info}
    pinned=$(sed -n 's/^Requires-Dist: torch==//p' "$WORK"/engine.tmp/activekv-*.dist-info/METADATA)
    [[ $pinned == "$carried" ]] || {
      echo "the engine was built against torch $pinned, not the carried $carried" >&2; exit 3; }
    echo "  built against torch $pinned"
  fi
  mv "$WORK/engine.tmp" "$WORK/engine"
elif rm -rf "$WORK/engine" && "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m pip install -q --no-deps --no-index --target "$WORK/engine" "$engine"
else  # a binary-only wheel is its site-packages layout: unpacking it installs it
  "$python" -m zipfile -e "$engine" "$WORK/engine"
fi

export PYTHONPATH="$WORK/engine:$WORK/vllm:$WORK/deps${lmcache:+:$WORK/lmcache}:$PWD${outer:+:$outer}"
# The CuTe DSL's `cutlass` (vLLM 0.34's warm-up imports it) is found through
# its .pth, which Python reads in site-packages but not on PYTHONPATH.
if [[ -d $WORK/deps/nvidia_cutlass_dsl/dsl_packages ]]; then
  PYTHONPATH="$PYTHONPATH:$WORK/deps/nvidia_cutlass_dsl/dsl_packages"
fi
export ACTIVEKV_UNPATCHED_VLLM="$WORK/vllm-unpatched" ACTIVEKV_TEST_CACHE="$WORK/cache"
# FlashInfer's top-p/top-k sampler has no precompiled kernels here (flashinfer-cubin
# is not carried), so the first vLLMs on a fresh machine compiled them in their
# start-up profiling: 124-132 s each for the 0.1.1 parity record's first four
# jobs, 4 s for the jobs after them. Every test, parity cell and benchmark
# here decodes greedily, which that sampler does not serve.
export VLLM_USE_FLASHINFER_SAMPLER=0
if [[ -n $lmcache ]]; then
  # vLLM's LMCacheConnectorV1 loads this adapter. LMCache binds its compiled ops
  # (pybind11 functions) over a torch fallback, silently where they fail to load.
  "$python" -c 'import importlib.metadata as m, types, lmcache
from lmcache.integration.vllm.vllm_v1_adapter import LMCacheConnectorV1Impl
ops = lmcache.c_ops
native = [n for n in dir(ops) if isinstance(getattr(ops, n, None), types.BuiltinFunctionType)
          and "c_ops" in (getattr(getattr(ops, n), "__module__", None) or "")]
print("lmcache", m.version("lmcache"), "from", lmcache.__file__, "compiled ops", len(native))
if not native:
    raise SystemExit("lmcache: its compiled ops (lmcache/c_ops) did not load with this torch: it would run its slow torch fallback")'
fi
# The same environment for later commands here (the parity gate, the served
# benchmark, the soak): `source WORK/env.sh` first.
{
  printf 'export PYTHONPATH=%q\n' "$PYTHONPATH"
  printf 'export ACTIVEKV_UNPATCHED_VLLM=%q ACTIVEKV_TEST_CACHE=%q\n' "$ACTIVEKV_UNPATCHED_VLLM" "$ACTIVEKV_TEST_CACHE"
  echo "export VLLM_USE_FLASHINFER_SAMPLER=0"
  [[ -z ${PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK:-} ]] || echo "export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1"
} > "$WORK/env.sh"
echo "+ for later runs here (python -m pipeline parity, bench.served, bench.soak): source $WORK/env.sh"
"$python" -c 'import torch, activekv, vllm; from vllm import LLM; print("torch", torch.__version__, "activekv from", activekv.__file__); print("vllm", vllm.__version__, "offers", activekv.vllm_features())'
# vLLM and its dependencies warn at import on this stack: the warnings are not ours to fail on.
exec "$python" -m pytest -m gpu tests/gpu -o filterwarnings=default -ra "${pytest_args[@]}"
