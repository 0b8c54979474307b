#!/usr/bin/env bash
# What ci/gpu-vllm-check.sh and ci/gpu-engine-check.sh need on a GPU host that
# has no network, moved there through a carry of 64 MiB a call (the lent GPU
# machine's): vLLM's pinned wheel, the wheels the host lacks and a GoogleTest
# source tree, packed here into folders that each fit one call with the
# tracked tree beside them, and put back together there.
#
#   ci/gpu-carry.sh pack [DIR]     here, with network: DIR/c0 (the wheels the host
#                                  lacks and GoogleTest's source), DIR/c1..cN (vLLM's
#                                  wheel in pieces). DIR defaults to build/carry.
#   ci/gpu-carry.sh take N [DIR]   there, in the call that carried DIR/cN: moves it
#                                  into STAGE (default /tmp/stage), in order from c0;
#                                  once the last piece is in, joins the wheel and
#                                  checks its sha256 against the pin.
#   ci/gpu-carry.sh where          there: the arguments the checks take, from STAGE.
#
# Calls follow each other within the machine's idle release (30 s), or the
# next one starts a bare machine: `take` says so and names the call to redo.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stage=${STAGE:-/tmp/stage}
version=0.26.0
wheel=vllm-$version-cp38-abi3-manylinux_2_28_x86_64.whl
carry_limit=$((64 << 20))

staged_pieces() {  # how many pieces of the wheel STAGE holds
  local p=("$stage"/piece.*)
  [[ -e ${p[0]} ]] && echo ${#p[@]} || echo 0
}

pinned_sha256() {
  "$python" -c 'import sys, tomllib; print(next(d["sha256"] for d in tomllib.load(open(sys.argv[1], "rb"))["distribution"] if d["name"] == "vllm" and d["version"] == sys.argv[2]))' \
    packaging/vllm-distributions.toml "$version"
}

pack() {
  local dir=${1:-build/carry}
  local tree  # bytes of the tracked tree, which travels with every call
  tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
  local piece=$(((carry_limit - tree - (2 << 20)) >> 20))  # MiB, 2 MiB to spare
  [[ $piece -ge 16 ]] || { echo "the tracked tree ($tree bytes) leaves under 16 MiB of a call's carry" >&2; exit 3; }
  local gtest=${GOOGLETEST_SRC:-/usr/src/googletest}
  [[ -f $gtest/CMakeLists.txt ]] || {
    echo "no GoogleTest source at $gtest: install Debian's googletest, or set GOOGLETEST_SRC" >&2; exit 3; }
  rm -rf "$dir" && mkdir -p "$dir/c0" "$dir/download"
  ci/gpu-vllm-check.sh --fetch "$dir/c0/deps"
  cp -a "$gtest" "$dir/c0/googletest"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 "vllm==$version" -d "$dir/download"
  [[ $(sha256sum "$dir/download/$wheel" | cut -d' ' -f1) == "$(pinned_sha256)" ]] || {
    echo "$dir/download/$wheel is not the wheel packaging/vllm-distributions.toml pins" >&2; exit 3; }
  split -b "${piece}M" -d -a 2 "$dir/download/$wheel" "$dir/download/piece."
  local n=0 p
  for p in "$dir"/download/piece.*; do
    n=$((n + 1)) && mkdir -p "$dir/c$n" && mv "$p" "$dir/c$n/"
  done
  echo "$n" > "$dir/c0/pieces"
  rm -rf "$dir/download"
  local c0
  c0=$(du -sb "$dir/c0" | cut -f1)
  [[ $((c0 + tree)) -le $carry_limit ]] || { echo "$dir/c0 ($c0 bytes) and the tree pass 64 MiB" >&2; exit 3; }
  echo "packed $dir/c0 ($((c0 >> 20)) MiB) and $n pieces of $wheel (${piece} MiB each):"
  echo "carry $dir/c0, then $dir/c1 .. $dir/c$n, one a call, each running: ci/gpu-carry.sh take N $dir"
}

take() {
  local n=$1 dir=${2:-build/carry}
  [[ -d $dir/c$n ]] || { echo "$dir/c$n is not here: name it in this call's carry" >&2; exit 3; }
  if [[ $n -eq 0 ]]; then
    rm -rf "$stage" && mkdir -p "$stage" && mv "$dir/c0"/* "$stage/"
  else
    [[ -f $stage/pieces ]] || { echo "no $stage/pieces: the machine went back; carry $dir/c0 again" >&2; exit 4; }
    local want=$(($(staged_pieces) + 1))
    [[ $n -eq $want ]] || { echo "$stage holds $((want - 1)) pieces: carry $dir/c$want next" >&2; exit 4; }
    mv "$dir/c$n"/piece.* "$stage/"
  fi
  local have
  have=$(staged_pieces)
  echo "staged c$n: $have of $(cat "$stage/pieces") pieces of $wheel"
  if [[ $have -eq $(cat "$stage/pieces") ]]; then
    cat "$stage"/piece.* > "$stage/$wheel.part" && rm "$stage"/piece.*
    [[ $(sha256sum "$stage/$wheel.part" | cut -d' ' -f1) == "$(pinned_sha256)" ]] || {
      rm "$stage/$wheel.part"; echo "the joined $wheel is not the pinned wheel: carry $dir/c0 and the pieces again" >&2; exit 5; }
    mv "$stage/$wheel.part" "$stage/$wheel"
    where
  fi
}

where() {
  [[ -f $stage/$wheel ]] || { echo "no $stage/$wheel yet" >&2; exit 4; }
  echo "ci/gpu-engine-check.sh $stage/googletest"
  echo "ci/gpu-vllm-check.sh --engine-source --vllm $stage/$wheel --deps $stage/deps"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  take) [[ $# -ge 2 ]] || { echo "usage: $0 take N [DIR]" >&2; exit 2; }; shift; take "$@" ;;
  where) where ;;
  *) echo "usage: $0 pack [DIR] | take N [DIR] | where (see the top of $0)" >&2; exit 2 ;;
esac
