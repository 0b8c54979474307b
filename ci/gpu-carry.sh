#!/usr/bin/env bash
# What ci/gpu-vllm-check.sh and ci/gpu-engine-check.sh need on a GPU host that
# has no network, moved there through a carry of 64 MiB a call, the working
# tree included (the project's GPU test machine's limit): vLLM's pinned wheel, the wheels the
# host lacks and a GoogleTest source tree, packed here into folders that each
# fit one call with the working tree beside them, and put back together there.
#
#   ci/gpu-carry.sh [--vllm-version V] pack [DIR]
#                                  here, with network: one archive of the wheels the
#                                  host lacks and vLLM's wheel, in pieces sized to the
#                                  working tree: DIR/c0 (GoogleTest's source and the
#                                  first piece), DIR/c1..cN (the rest; pack says N).
#                                  DIR defaults to build/carry.
#   ci/gpu-carry.sh [--vllm-version V] take N [DIR]
#                                  there, in the call that carried DIR/cN: moves it
#                                  into STAGE (default /tmp/stage), in order from c0;
#                                  once the last piece is in, joins the archive, checks
#                                  it is the one packed, unpacks it and checks vLLM's
#                                  wheel against the pin. Taking a folder already
#                                  taken changes nothing. Taking c0 also probes.
#   ci/gpu-carry.sh [--vllm-version V] where
#                                  there: the checks' command lines, from STAGE.
#   ci/gpu-carry.sh probe          there: the host's torch stack and CUDA libraries
#                                  (pip show), to compare with what a vLLM's torch pins.
#
# The vLLM: 0.26.0 (on the host's own torch 2.11.0) unless --vllm-version or
# VLLM_VERSION names another (0.34.0: torch 2.14.0, its triton and NCCL travel
# too, about 1.4 GB, some 30 calls). Its wheel is the one PINS pins for that
# version, the other wheels ci/gpu-vllm-check.sh's list for it. A pack for
# another version than 0.26.0 says which in c0 (vllm-version), and take refuses
# it under another version.
# The pieces are sized to the tree as it was at pack, with SPARE_MIB (default
# 2) MiB to spare: pack again once the tree has grown (or leave more to spare
# where others add files), and keep a call's results out of the tree until the
# last piece is taken. Calls follow each other within the machine's idle
# release (30 s), or the next one starts a bare machine: `take` says so and
# names the call to redo.
# PINS: the distributions file (default packaging/vllm-distributions.toml).
# DOWNLOADED: pack from this folder (deps/ and vLLM's wheel) instead of fetching.
# RELEASE=1 (with DOWNLOADED): carry a release's wheels from DOWNLOADED/release/
# (its patched vLLM wheel and engine wheel, and any wheel its checks need)
# instead of the pinned pristine vLLM: a check then runs on what ships, and the
# archive is some 240 MB smaller. The archive's sha256 vouches for them; `where`
# names them.
# LMCACHE=1 (vLLM 0.26.0 only; pack): LMCache's wheels travel too
# (packaging/cuda/gpu-lmcache-requirements.txt, in deps/ beside vLLM's, some 27 MiB:
# at most one piece more), for the served benchmark's `lmcache` engine; fetched with
# vLLM's list, or found in DOWNLOADED/deps. c0 says so (carries-lmcache): take needs no
# switch, and `where` names the check with LMCACHE=1. Taking with LMCACHE=1 a pack
# without them is refused.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$here/$1"; }  # as the caller named it
python=${PYTHON:-python3}
stage=$(absolute "${STAGE:-/tmp/stage}")
pins=$(absolute "${PINS:-$PWD/packaging/vllm-distributions.toml}")
version=${VLLM_VERSION:-0.26.0}
if [[ ${1:-} == --vllm-version ]]; then
  [[ $# -ge 2 ]] || { echo "--vllm-version needs a version" >&2; exit 2; }
  version=$2
  shift 2
fi
default_version=0.26.0  # a pack without c0/vllm-version is one of it
lmcache=${LMCACHE:-0}  # LMCache's wheels too: anything but 0 or empty
[[ $lmcache == 0 ]] && lmcache=
lmcache_list=packaging/cuda/gpu-lmcache-requirements.txt
if [[ -n $lmcache && $version != 0.26.0 ]]; then
  echo "LMCACHE=1: LMCache's wheels ($lmcache_list) travel with vLLM 0.26.0 only, not $version" >&2
  exit 3
fi
spare=$(( ${SPARE_MIB:-2} << 20 ))  # bytes a call leaves unused
carry_limit=${CARRY_LIMIT:-$((64 << 20))}  # bytes a call carries (tests set less)
min_piece=${MIN_PIECE:-$((16 << 20))}     # fewer bytes a call: too many calls

pin() {  # FIELD: the pinned vLLM's file or sha256
  "$python" -c 'import sys, tomllib
pins = tomllib.load(open(sys.argv[1], "rb"))["distribution"]
print(next(d[sys.argv[3]] for d in pins if d["name"] == "vllm" and d["version"] == sys.argv[2]))' \
    "$pins" "$version" "$1" 2>/dev/null || { echo "no vllm $version $1 read from $pins" >&2; exit 3; }
}
if [[ ${1:-} != probe ]]; then  # the probe needs no pin
  wheel=$(pin file)
  sha256=$(pin sha256)
  [[ $sha256 =~ ^[0-9a-f]{64}$ ]] || { echo "$pins: vllm $version's sha256 is not 64 hex digits" >&2; exit 3; }
fi

sha256_of() {  # FILE: its sha256, hex
  local got
  got=$(sha256sum "$1")
  echo "${got%% *}"
}

matches_pin() {  # FILE
  [[ $(sha256_of "$1") == "$sha256" ]]
}

carries_release() {  # whether the staged archive holds a release's wheels, not the pinned vLLM
  [[ -f $stage/carries-release ]]
}

joined() {  # whether STAGE holds the unpacked archive
  if carries_release; then [[ -d $stage/release && -d $stage/deps ]]; else [[ -f $stage/$wheel && -d $stage/deps ]]; fi
}

version_of() {  # FOLDER: the vLLM of the pack whose c0 it holds (c0, or STAGE once c0 is taken)
  cat "$1/vllm-version" 2>/dev/null || echo "$default_version"
}

staged_pieces() {  # how many pieces of the archive STAGE holds
  local p=("$stage"/piece.*)
  if [[ -e ${p[0]} ]]; then echo ${#p[@]}; else echo 0; fi
}

carry_bytes() {  # FILE...: bytes as tar carries them: a 512-byte header, contents in 512-byte blocks
  local files=() f
  for f in "$@"; do [[ -f $f ]] && files+=("$f"); done
  [[ ${#files[@]} -gt 0 ]] || { echo 0; return; }
  stat -c %s -- "${files[@]}" | awk '{ total += 512 + int(($1 + 511) / 512) * 512 } END { printf "%d\n", total }'
}

pack() {
  local named=${1:-build/carry} dir  # named: as the caller wrote it, for the messages
  dir=$(absolute "$named")
  local files=() tree  # the working tree travels with every call
  mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard)
  [[ ${#files[@]} -gt 0 ]] || { echo "git lists no file in $PWD: pack from a checkout" >&2; exit 3; }
  tree=$(carry_bytes "${files[@]}")
  local piece=$((carry_limit - tree - spare))  # bytes a call
  [[ $piece -ge $min_piece ]] || {
    echo "the working tree ($tree bytes) leaves $piece bytes of a call's carry, under $min_piece" >&2; exit 3; }
  local gtest=${GOOGLETEST_SRC:-/usr/src/googletest}
  [[ -f $gtest/CMakeLists.txt ]] || {
    echo "no GoogleTest source at $gtest: install Debian's googletest, or set GOOGLETEST_SRC" >&2; exit 3; }
  # Built beside DIR and moved in at the end: a pack that fails leaves the last one.
  local new=$dir.new download
  rm -rf "$new"
  mkdir -p "$new/c0"
  download=$new/download
  if [[ -n ${DOWNLOADED:-} ]]; then
    download=$(absolute "$DOWNLOADED")
  else
    ci/gpu-vllm-check.sh --vllm-version "$version" --fetch "$download/deps"
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 "vllm==$version" -d "$download"
  fi
  local carried=("$wheel")
  if [[ -n ${RELEASE:-} ]]; then
    local patched=("$download/release/vllm-$version+"*.whl)
    [[ -n ${DOWNLOADED:-} && -f ${patched[0]} ]] || {
      rm -rf "$new"; echo "RELEASE: no $download/release/vllm-$version+*.whl (a patched vLLM wheel) to carry" >&2; exit 3; }
    carried=(release)
    touch "$new/c0/carries-release"
  elif ! matches_pin "$download/$wheel"; then
    rm -rf "$new"
    echo "$download/$wheel is not the wheel $pins pins" >&2
    exit 3
  fi
  if [[ -n $lmcache ]]; then  # the list's wheels were fetched into deps/ with vLLM's
    local lmc
    lmc=$(sed -n 's/^lmcache==\([^ ]*\).*/\1/p' "$lmcache_list")
    local found=("$download/deps/lmcache-$lmc-"*.whl)
    [[ -n $lmc && -f ${found[0]} ]] || { rm -rf "$new"
      echo "LMCACHE: no $download/deps/lmcache-$lmc-*.whl: fetch with LMCACHE=1 ci/gpu-vllm-check.sh --fetch DIR/deps" >&2
      exit 3; }
    touch "$new/c0/carries-lmcache"
  fi
  cp -a "$gtest" "$new/c0/googletest"
  local archive=$new/payload.tar
  tar -cf "$archive" -C "$download" deps "${carried[@]}"
  sha256_of "$archive" > "$new/c0/payload.sha256"
  echo 0 > "$new/c0/pieces"  # counted below; here so that c0's size counts it
  [[ $version == "$default_version" ]] || echo "$version" > "$new/c0/vllm-version"
  # c0 fills its call with GoogleTest and the first piece; the rest split
  # evenly, each piece less its own tar header and rounding.
  mapfile -d '' files < <(find "$new/c0" -type f -print0)
  local first=$((piece - $(carry_bytes "${files[@]}") - 1024))
  [[ $first -gt 0 ]] || { echo "GoogleTest ($gtest) leaves c0 no room for a piece" >&2; exit 3; }
  head -c "$first" "$archive" > "$new/c0/piece.00"
  local n=0 p
  if [[ $(stat -c %s "$archive") -gt $first ]]; then
    tail -c +$((first + 1)) "$archive" | split -b $((piece - 1024)) -a 2 --numeric-suffixes=1 - "$new/piece."
    for p in "$new"/piece.*; do
      n=$((n + 1))
      mkdir -p "$new/c$n"
      mv "$p" "$new/c$n/"
    done
  fi
  echo "$((n + 1))" > "$new/c0/pieces"
  rm -rf "$archive" "$new/download"
  rm -rf "$dir"
  mv "$new" "$dir"
  local run=ci/gpu-carry.sh
  [[ $version == "$default_version" ]] || run="VLLM_VERSION=$version $run"
  local with=
  [[ -z $lmcache ]] || with=" and LMCache's wheels"
  echo "packed vLLM $version$with: $named/c0 (GoogleTest and the first piece) and $n more pieces of the wheels'" \
    "archive ($((piece >> 20)) MiB each, the tree at $((tree >> 20)) MiB, $((spare >> 20)) MiB to spare):"
  echo "carry $named/c0, then $named/c1 .. $named/c$n, one a call, each running: $run take N $named"
}

take() {
  local n=$1 named=${2:-build/carry} dir
  dir=$(absolute "$named")
  [[ $n =~ ^[0-9]+$ ]] || { echo "take $n: N is the number of a carried folder (0, 1, ...)" >&2; exit 2; }
  local carried=("$dir/c$n"/*) packed
  if [[ $n -eq 0 && -e ${carried[0]} ]]; then
    [[ -f $dir/c0/pieces && $(cat "$dir/c0/payload.sha256" 2>/dev/null) =~ ^[0-9a-f]{64}$ ]] || {
      echo "$named/c0 holds no pieces count or archive sha256: pack again" >&2; exit 3; }
    packed=$(version_of "$dir/c0")
    [[ $packed == "$version" ]] || {
      echo "$named/c0 was packed for vLLM $packed, not $version: take it with VLLM_VERSION=$packed" >&2; exit 3; }
    [[ -z $lmcache || -f $dir/c0/carries-lmcache ]] || {
      echo "$named/c0 was packed without LMCache's wheels: pack again with LMCACHE=1" >&2; exit 3; }
    if [[ $(cat "$stage/payload.sha256" 2>/dev/null) == "$(cat "$dir/c0/payload.sha256")" ]]; then
      echo "$named/c0 was taken already (the same archive)"
    else
      rm -rf "$stage"  # another archive, or none: start over
      mkdir -p "$stage"
      mv "$dir/c0"/* "$stage/"
      rmdir "$dir/c0"
      probe
    fi
  elif [[ -f $stage/pieces && $(version_of "$stage") != "$version" ]]; then
    packed=$(version_of "$stage")
    echo "$stage holds the archive of vLLM $packed, not $version: take with VLLM_VERSION=$packed" >&2
    exit 3
  elif joined; then
    echo "$wheel is already joined in $stage"
    where
    return
  elif [[ ($n -eq 0 && -f $stage/pieces) || ($n -gt 0 && -e $stage/piece.$(printf %02d "$n")) ]]; then
    echo "$named/c$n was taken already"  # and joined below if a join failed after it
  elif [[ ! -e ${carried[0]} ]]; then
    echo "$named/c$n is not here (or empty): name it in this call's carry" >&2
    exit 3
  else
    [[ -f $stage/pieces ]] || { echo "no $stage/pieces: the machine went back; carry $named/c0 again" >&2; exit 4; }
    local want
    want=$(staged_pieces)  # c0 brought piece 00, cN brings piece N
    [[ $n -eq $want ]] || { echo "$stage holds $want pieces: carry $named/c$want next" >&2; exit 4; }
    mv "$dir/c$n"/piece.* "$stage/"
    rmdir "$dir/c$n"
  fi
  joined && { where; return; }  # c0 again, after the join
  local have total
  have=$(staged_pieces)
  total=$(cat "$stage/pieces")
  echo "staged c$n: $have of $total pieces of the wheels' archive"
  [[ $have -eq $total ]] || return 0
  join_archive "$named"
}

join_archive() {  # NAMED: every piece is in STAGE; the archive, checked, unpacked there
  local named=$1
  cat "$stage"/piece.* > "$stage/payload.tar"
  if [[ $(sha256_of "$stage/payload.tar") != "$(cat "$stage/payload.sha256")" ]]; then
    rm -f "$stage/payload.tar" "$stage"/piece.*  # which piece changed is not known
    echo "the joined archive is not the one packed: carry $named/c0 and the pieces again" >&2
    exit 5
  fi
  rm -rf "$stage/unpacked"
  mkdir "$stage/unpacked"
  tar -xf "$stage/payload.tar" -C "$stage/unpacked"
  rm "$stage/payload.tar"
  if ! carries_release && ! matches_pin "$stage/unpacked/$wheel"; then
    rm -rf "$stage/unpacked" "$stage"/piece.*
    echo "the archive's $wheel is not the wheel $pins pins: pack again, then carry c0 and the pieces" >&2
    exit 5
  fi
  rm -rf "$stage/deps" "$stage/release"
  mv "$stage/unpacked/deps" "$stage/deps"
  if carries_release; then mv "$stage/unpacked/release" "$stage/release"; else mv "$stage/unpacked/$wheel" "$stage/$wheel"; fi
  rmdir "$stage/unpacked"
  rm "$stage"/piece.*  # only now: a failed unpack can be taken again from the pieces
  where
}

where() {
  local check=ci/gpu-vllm-check.sh
  [[ ! -f $stage/carries-lmcache ]] || check="LMCACHE=1 $check"  # its wheels are in deps/
  if carries_release; then
    local engine=("$stage"/release/activekv-*.whl) patched=("$stage"/release/vllm-"$version"+*.whl)
    [[ -f ${patched[0]} ]] || { echo "no $stage/release/vllm-$version+*.whl yet" >&2; exit 4; }
    echo "ci/gpu-engine-check.sh $stage/googletest"
    echo "$check --vllm-version $version --engine ${engine[0]} --vllm ${patched[0]} --deps $stage/deps"
    return
  fi
  [[ -f $stage/$wheel ]] || { echo "no $stage/$wheel yet" >&2; exit 4; }
  echo "ci/gpu-engine-check.sh $stage/googletest"
  echo "$check --vllm-version $version --engine-source --vllm $stage/$wheel --deps $stage/deps"
}

probe() {  # the host's torch and CUDA libraries, as pip knows them
  echo "the host's torch stack and CUDA libraries (pip show):"
  "$python" -m pip show torch triton nvidia-nccl-cu13 nvidia-cudnn-cu13 nvidia-cusparselt-cu13 \
    nvidia-nvshmem-cu13 cuda-toolkit nvidia-cuda-runtime \
    | awk '/^Name:/ { name = $2 } /^Version:/ { printf "  %s %s\n", name, $2 }' || true
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  take) [[ $# -ge 2 ]] || { echo "usage: $0 take N [DIR]" >&2; exit 2; }; shift; take "$@" ;;
  where) where ;;
  probe) probe ;;
  *) echo "usage: $0 [--vllm-version V] pack [DIR] | take N [DIR] | where | probe (see the top of $0)" >&2; exit 2 ;;
esac
