#!/usr/bin/env bash
# tests/gpu on the GPU test machine in groups that fit one call there (10
# minutes at most): after `ci/gpu-vllm-check.sh ... -- -k nothing` (or
# `ci/gpu-parity-evidence.sh install`) wrote WORK/env.sh, each group is a
# pytest process of its own, up to JOBS of them at once on the card (each
# vLLM of the tiny model asks for 0.3 of it free as it starts: 3 on an H100),
# and the group `once` (the refusals and the extensible KV cache, which lets
# vLLM size its cache from the whole card) alone after them.
#
#   OUT=DIR ci/gpu-vllm-tests.sh [GROUP ...]
#       GROUP: compiled-head128 compiled-head32 eager-head128 eager-head32 once
#       (default: all five); each one's output in OUT/tests-GROUP.txt, and a
#       line per group with pytest's summary. Exit 0 only if every group passed.
#
# JOBS (default 3), LIMIT_S (each group's limit, default 540), STAGGER_S (the
# seconds between two groups' starts, default 20), WORK (default
# /tmp/work-vllm-$VLLM_VERSION), VLLM_VERSION (default 0.34.0).
set -uo pipefail
cd "$(dirname "$0")/.."
version=${VLLM_VERSION:-0.34.0}
work=${WORK:-/tmp/work-vllm-$version}
jobs=${JOBS:-3} limit=${LIMIT_S:-540} stagger=${STAGGER_S:-20}
all_groups=(compiled-head128 compiled-head32 eager-head128 eager-head32 once)
groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=("${all_groups[@]}")
for group in "${groups[@]}"; do
  [[ " ${all_groups[*]} " == *" $group "* ]] || { echo "unknown group $group (${all_groups[*]})" >&2; exit 2; }
done
[[ -n ${OUT:-} ]] || { echo "OUT: the call's output folder" >&2; exit 2; }
if [[ ! -f $work/env.sh ]]; then
  echo "no $work/env.sh: run ci/gpu-parity-evidence.sh install (or ci/gpu-vllm-check.sh ... -- -k nothing) first" >&2
  exit 2
fi
# shellcheck disable=SC1091
source "$work/env.sh"
mkdir -p "$OUT"

run_group() {
  local group=$1 mode select
  if [[ $group == once ]]; then
    mode=eager select="not head32 and not head128"
  else
    mode=${group%%-*} select=${group#*-}
  fi
  ACTIVEKV_GPU_MODES=$mode PYTHONUNBUFFERED=1 timeout "$limit" \
    python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -k "$select" -v -rs > "$OUT/tests-$group.txt" 2>&1
  local code=$?
  echo "exit $code" >> "$OUT/tests-$group.txt"
  return $code
}

failed=0
pids=() names=()
for group in "${groups[@]}"; do
  [[ $group == once ]] && continue
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do sleep 2; done
  run_group "$group" & pids+=($!) names+=("$group")
  sleep "$stagger"  # starts apart: vLLM measures the card's free memory as it starts
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
if [[ " ${groups[*]} " == *" once "* ]]; then
  run_group once || failed=1
  names+=(once)
fi
for group in "${names[@]}"; do
  summary=$(grep -E '^=+ .* in [0-9.]+s' "$OUT/tests-$group.txt" | tail -1 | tr -d '=' | sed 's/^ *//')
  echo "$group: $summary ($(tail -1 "$OUT/tests-$group.txt"))"
done
exit $failed
