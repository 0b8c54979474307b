#!/usr/bin/env bash
# What ci/gpu-vllm-check.sh and ci/gpu-engine-check.sh need on a GPU host that
# has no network, moved there through a carry of 64 MiB a call (the lent GPU
# machine's): vLLM's pinned wheel, the wheels the host lacks and a GoogleTest
# source tree, packed here into folders that each fit one call with the
# working tree beside them, and put back together there.
#
#   ci/gpu-carry.sh pack [DIR]     here, with network: DIR/c0 (GoogleTest's source, a
#                                  few MiB), DIR/c1..cN (one archive of the wheels the
#                                  host lacks and vLLM's wheel, in pieces sized to the
#                                  working tree; pack says N). DIR defaults to build/carry.
#   ci/gpu-carry.sh take N [DIR]   there, in the call that carried DIR/cN: moves it
#                                  into STAGE (default /tmp/stage), in order from c0;
#                                  once the last piece is in, joins the archive, checks
#                                  it is the one packed, unpacks it and checks vLLM's
#                                  wheel against the pin. Taking a folder already
#                                  taken changes nothing.
#   ci/gpu-carry.sh where          there: the checks' command lines, from STAGE.
#
# Only c0 is a fixed size; the pieces shrink as the tree grows, so every call
# fits. Calls follow each other within the machine's idle release (30 s), or
# the next one starts a bare machine: `take` says so and names the call to redo.
# PINS: the distributions file (default packaging/vllm-distributions.toml).
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$here/$1"; }  # as the caller named it
python=${PYTHON:-python3}
stage=$(absolute "${STAGE:-/tmp/stage}")
pins=$(absolute "${PINS:-$PWD/packaging/vllm-distributions.toml}")
version=0.26.0
carry_limit=$((64 << 20))

pin() {  # FIELD: the pinned vLLM's file or sha256
  "$python" -c 'import sys, tomllib
pins = tomllib.load(open(sys.argv[1], "rb"))["distribution"]
print(next(d[sys.argv[3]] for d in pins if d["name"] == "vllm" and d["version"] == sys.argv[2]))' \
    "$pins" "$version" "$1" 2>/dev/null || { echo "no vllm $version $1 read from $pins" >&2; exit 3; }
}
wheel=$(pin file)
sha256=$(pin sha256)
[[ $sha256 =~ ^[0-9a-f]{64}$ ]] || { echo "$pins: vllm $version's sha256 is not 64 hex digits" >&2; exit 3; }

matches_pin() {  # FILE
  local got
  got=$(sha256sum "$1")
  [[ ${got%% *} == "$sha256" ]]
}

staged_pieces() {  # how many pieces of the archive STAGE holds
  local p=("$stage"/piece.*)
  if [[ -e ${p[0]} ]]; then echo ${#p[@]}; else echo 0; fi
}

carry_bytes() {  # FILE...: bytes as tar carries them: a 512-byte header, contents in 512-byte blocks
  local f size total=0
  for f in "$@"; do
    [[ -f $f ]] || continue
    size=$(stat -c %s "$f")
    total=$((total + 512 + (size + 511) / 512 * 512))
  done
  echo "$total"
}

pack() {
  local named=${1:-build/carry} dir  # named: as the caller wrote it, for the messages
  dir=$(absolute "$named")
  local files=() tree  # the working tree travels with every call
  mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard)
  tree=$(carry_bytes "${files[@]}")
  local piece=$(((carry_limit - tree - (2 << 20)) >> 20))  # MiB, 2 MiB to spare
  [[ $piece -ge 16 ]] || { echo "the working tree ($tree bytes) leaves under 16 MiB of a call's carry" >&2; exit 3; }
  local gtest=${GOOGLETEST_SRC:-/usr/src/googletest}
  [[ -f $gtest/CMakeLists.txt ]] || {
    echo "no GoogleTest source at $gtest: install Debian's googletest, or set GOOGLETEST_SRC" >&2; exit 3; }
  rm -rf "$dir"
  mkdir -p "$dir/c0" "$dir/download"
  cp -a "$gtest" "$dir/c0/googletest"
  ci/gpu-vllm-check.sh --fetch "$dir/download/deps"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 "vllm==$version" -d "$dir/download"
  matches_pin "$dir/download/$wheel" || { echo "$dir/download/$wheel is not the wheel $pins pins" >&2; exit 3; }
  tar -cf "$dir/download/payload.tar" -C "$dir/download" deps "$wheel"
  local sum
  sum=$(sha256sum "$dir/download/payload.tar")
  echo "${sum%% *}" > "$dir/c0/payload.sha256"
  split -b "${piece}M" -d -a 2 "$dir/download/payload.tar" "$dir/download/piece."
  local n=0 p
  for p in "$dir"/download/piece.*; do
    n=$((n + 1))
    mkdir -p "$dir/c$n"
    mv "$p" "$dir/c$n/"
  done
  echo "$n" > "$dir/c0/pieces"
  rm -rf "$dir/download"
  local c0
  mapfile -d '' files < <(find "$dir/c0" -type f -print0)
  c0=$(carry_bytes "${files[@]}")
  [[ $((c0 + tree + (1 << 20))) -le $carry_limit ]] || {
    echo "$dir/c0 ($c0 bytes) and the tree ($tree) leave under 1 MiB of a call's carry" >&2; exit 3; }
  echo "packed $named/c0 ($((c0 >> 20)) MiB) and $n pieces of the wheels' archive (${piece} MiB each):"
  echo "carry $named/c0, then $named/c1 .. $named/c$n, one a call, each running: ci/gpu-carry.sh take N $named"
}

take() {
  local n=$1 named=${2:-build/carry} dir
  dir=$(absolute "$named")
  [[ $n =~ ^[0-9]+$ ]] || { echo "take $n: N is the number of a carried folder (0, 1, ...)" >&2; exit 2; }
  if [[ -f $stage/$wheel ]]; then
    echo "$wheel is already joined in $stage"
    where
    return
  fi
  local carried=("$dir/c$n"/*)
  if [[ ! -e ${carried[0]} ]]; then
    if [[ $n -eq 0 && -f $stage/pieces ]]; then echo "$named/c0 was taken already"; return; fi
    if [[ $n -gt 0 && -e $stage/piece.$(printf %02d $((n - 1))) ]]; then echo "$named/c$n was taken already"; return; fi
    echo "$named/c$n is not here (or empty): name it in this call's carry" >&2
    exit 3
  fi
  if [[ $n -eq 0 ]]; then
    rm -rf "$stage"
    mkdir -p "$stage"
    mv "$dir/c0"/* "$stage/"
  else
    [[ -f $stage/pieces ]] || { echo "no $stage/pieces: the machine went back; carry $named/c0 again" >&2; exit 4; }
    local want
    want=$(($(staged_pieces) + 1))
    [[ $n -eq $want ]] || { echo "$stage holds $((want - 1)) pieces: carry $named/c$want next" >&2; exit 4; }
    mv "$dir/c$n"/piece.* "$stage/"
  fi
  rmdir "$dir/c$n"
  local have total
  have=$(staged_pieces)
  total=$(cat "$stage/pieces")
  echo "staged c$n: $have of $total pieces of the wheels' archive"
  [[ $have -eq $total ]] || return 0
  cat "$stage"/piece.* > "$stage/payload.tar"
  local sum
  sum=$(sha256sum "$stage/payload.tar")
  if [[ ${sum%% *} != "$(cat "$stage/payload.sha256")" ]]; then
    rm "$stage/payload.tar"
    echo "the joined archive is not the one packed: carry $named/c0 and the pieces again" >&2
    exit 5
  fi
  rm "$stage"/piece.*
  rm -rf "$stage/unpacked"
  mkdir "$stage/unpacked"
  tar -xf "$stage/payload.tar" -C "$stage/unpacked"
  rm "$stage/payload.tar"
  if ! matches_pin "$stage/unpacked/$wheel"; then
    rm -rf "$stage/unpacked"
    echo "the archive's $wheel is not the wheel $pins pins: pack again, then carry c0 and the pieces" >&2
    exit 5
  fi
  mv "$stage/unpacked/deps" "$stage/deps"
  mv "$stage/unpacked/$wheel" "$stage/$wheel"
  rmdir "$stage/unpacked"
  where
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
