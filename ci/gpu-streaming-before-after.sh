#!/usr/bin/env bash
# The layer streamer's speed before and after an engine change, on a machine
# with an accelerator and torch: streaming_bench built from two engine trees
# with the same flags, then run in alternating order, so that drift in the
# machine (clocks, the host's memory) falls on both sides alike.
#
#   ci/gpu-streaming-before-after.sh build BEFORE_ENGINE_DIR [AFTER_ENGINE_DIR]
#       builds BUILD/gpu-before/streaming_bench from BEFORE_ENGINE_DIR (an
#       engine/ folder of another commit: `git archive COMMIT engine | tar -x
#       -C DIR`) and BUILD/gpu-after/streaming_bench from AFTER_ENGINE_DIR
#       (default ./engine). BUILD is BUILD_ROOT (default build).
#   OUT=DIR ci/gpu-streaming-before-after.sh run [FIRST_ROUND [LAST_ROUND]]
#       rounds FIRST_ROUND..LAST_ROUND (default 1..3) of the two parts below,
#       each side once a round, "before" first in even rounds; each run's output
#       in OUT/PART-SIDE-ROUND.txt. `python -m bench.streaming_before_after
#       OUT ...` reads them into one table.
#
# The parts (each run cut off after its limit, rc=124 in its file's last line;
# the points it finished are whole):
#   grid        --only grid --contexts 16384        (GRID_S, default 55 s: decode 16k x1 and x4)
#   compressed  --only compressed --contexts 131072
#               --variants compressed-fused-batch  (COMPRESSED_S, default 50 s: decode 128k x1)
# PARTS (default "grid compressed") runs fewer; GRID_S=35 keeps the grid to
# its 16k x1 points (the homes' allocation takes 12-27 s of each run).
# BUDGET_S (default 560): no run starts that could end after it.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
root=${BUILD_ROOT:-build}

build_one() {  # SOURCE BUILD_DIR
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DACTIVEKV_BUILD_PYTHON=OFF -DACTIVEKV_BUILD_TESTS=OFF -DACTIVEKV_BUILD_BENCH=ON \
    -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null &&
    cmake --build "$2" --target streaming_bench >/dev/null
}

case ${1:-} in
  build)
    [[ -d ${2:-} ]] || { echo "usage: $0 build BEFORE_ENGINE_DIR [AFTER_ENGINE_DIR] (engine/ folders)" >&2; exit 2; }
    after=${3:-engine}
    build_one "$after" "$root/gpu-after" || { echo "build of $after failed" >&2; exit 1; }
    build_one "$2" "$root/gpu-before" || { echo "build of $2 failed" >&2; exit 1; }
    echo "built $root/gpu-after/streaming_bench and $root/gpu-before/streaming_bench"
    ;;
  run)
    [[ -n ${OUT:-} ]] || { echo "OUT: the folder for the runs' output" >&2; exit 2; }
    for side in after before; do
      [[ -x $root/gpu-$side/streaming_bench ]] || { echo "no $root/gpu-$side/streaming_bench: run '$0 build' first" >&2; exit 2; }
    done
    first=${2:-1} last=${3:-3} budget=${BUDGET_S:-560} grid_s=${GRID_S:-55} compressed_s=${COMPRESSED_S:-50}
    mkdir -p "$OUT"
    start=$SECONDS
    for ((round = first; round <= last; round++)); do
      sides=(after before)
      ((round % 2 == 0)) && sides=(before after)
      for part in ${PARTS:-grid compressed}; do
        [[ $part == grid || $part == compressed ]] || { echo "PARTS: grid or compressed, not $part" >&2; exit 2; }
        if [[ $part == grid ]]; then
          limit=$grid_s flags=(--only grid --contexts 16384)
        else
          limit=$compressed_s flags=(--only compressed --contexts 131072 --variants compressed-fused-batch)
        fi
        for side in "${sides[@]}"; do
          if ((SECONDS - start + limit > budget)); then
            echo "budget: $part-$side-$round and after not run"
            continue 3
          fi
          file=$OUT/$part-$side-$round.txt
          timeout "$limit" "$root/gpu-$side/streaming_bench" "${flags[@]}" --back-to-back 8 > "$file" 2>&1
          echo "rc=$?" >> "$file"
          echo "$part $side round $round: $(grep -c '^RESULT {"part": "\(grid\|compressed\)"' "$file") points"
        done
      done
    done
    ;;
  *) echo "usage: $0 build BEFORE_ENGINE_DIR | run [FIRST_ROUND [LAST_ROUND]] (see the top of $0)" >&2; exit 2 ;;
esac
