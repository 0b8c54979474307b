#!/usr/bin/env bash
# The cuda release's parity evidence on the GPU test machine, from what
# `RELEASE=1 ci/gpu-carry.sh pack` carried there (the release's own two wheels
# and vLLM's dependencies, taken into STAGE). A command there runs at most 10
# minutes; the harness keeps each unit it ends (--resume), so `run` is
# repeated until the record is written, and what each call ended comes back.
#
#   ci/gpu-parity-evidence.sh install          vLLM's dependencies into WORK (about 65 s)
#   ci/gpu-parity-evidence.sh run [JOBS [LIMIT_S]]
#                                              the gate on the two wheels for at most LIMIT_S
#                                              (default 540), JOBS units at once (default 4);
#                                              then into OUT: the record (once written),
#                                              the jobs' logs and every unit ended so far
#                                              (parity-jobs.tgz), and each unit's times.
#   AGAIN="UNIT ..." ci/gpu-parity-evidence.sh run ...
#                                              the same, running the named units again (a
#                                              failed unit is kept as failed): each one's
#                                              kept result and log go to OUT as
#                                              UNIT-before.json / UNIT-before.log first.
#
# Units a machine ended travel to the next one: carry OUT's parity-jobs.tgz as
# build/parity-cuda-units.tgz and `run` starts from its units (they are kept
# only where the wheels and the harness are the same bytes).
# The jobs' vLLMs are given their KV cache in bytes, so they start side by
# side (vLLM then skips the memory profiling that refuses a start while
# another process frees GPU memory); each holds about 9 GiB and wants 0.3 of
# the card free as it starts, so 4 jobs on an H100, up to 8 on an H200
# (docs/gpu-test-machine.md; the first start on a machine compiles FlashInfer).
# STAGE (default /tmp/stage), WORK (default /tmp/work-vllm-0.34.0), OUT: the
# call's output folder. VLLM_VERSION: 0.34.0 unless given.
set -uo pipefail
cd "$(dirname "$0")/.."
version=${VLLM_VERSION:-0.34.0}
stage=${STAGE:-/tmp/stage}
work=${WORK:-/tmp/work-vllm-$version}
record=/tmp/parity/parity-cuda.json
harness=${record%.json}/harness  # the harness's folder beside the record (the stage's layout)
engine=$(ls "$stage"/release/activekv-*+cu*.whl 2>/dev/null | head -1)
vllm=$(ls "$stage"/release/vllm-"$version"+activekv.*.whl 2>/dev/null | head -1)
[[ -n $engine && -n $vllm ]] || { echo "no engine or vLLM wheel in $stage/release: carry a RELEASE=1 pack first" >&2; exit 2; }
case ${1:-} in
install)
  WORK=$work ACTIVEKV_GPU_MODES=eager ci/gpu-vllm-check.sh --vllm-version "$version" --engine "$engine" \
    --vllm "$vllm" --deps "$stage/deps" -- -k nothing
  code=$?
  [[ $code == 5 ]] && code=0  # no test selected: the installs are what was asked for
  exit $code ;;
run)
  jobs=${2:-4} limit=${3:-540}
  [[ -n ${OUT:-} ]] || { echo "OUT: the call's output folder" >&2; exit 2; }
  # shellcheck disable=SC1091
  source "$work/env.sh"
  mkdir -p "$OUT"
  if [[ -f build/parity-cuda-units.tgz && ! -d $harness/units ]]; then
    mkdir -p "$harness" && tar xzf build/parity-cuda-units.tgz -C "$harness" units
    echo "units carried in: $(ls "$harness/units" | tr '\n' ' ')"
  fi
  for unit in ${AGAIN:-}; do
    [[ -f $harness/units/$unit.json ]] || { echo "AGAIN: no unit $unit in $harness/units" >&2; exit 2; }
    mv "$harness/units/$unit.json" "$OUT/$unit-before.json"
    cp "$harness/jobs/$unit.log" "$OUT/$unit-before.log" 2>/dev/null
    echo "running $unit again (its kept result: $unit-before.json)"
  done
  start=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "$limit" python3 -m pipeline parity --target cuda --engine-wheel "$engine" \
    --vllm-wheel "$vllm" --out "$record" --jobs "$jobs"
  code=$?
  echo "parity: exit $code after $(($(date +%s) - start)) s"
  cp "$record" "$OUT/" 2>/dev/null
  (cd "$harness" && tar czf "$OUT/parity-jobs.tgz" jobs/*.log units 2>/dev/null)
  grep -h "^parity: .* in [0-9.]* s" "$harness"/jobs/*.log
  exit $code ;;
*)
  sed -n '2,/^set -uo/p' "$0" | sed '$d' >&2
  exit 2 ;;
esac
