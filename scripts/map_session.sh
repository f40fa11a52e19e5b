#!/usr/bin/env bash
# The map runs on a GPU machine (no network): install, the map's tests, a smoke map, then `mxbench map` per preset
# with our FP8 rowwise GEMM (triton_ws) and with torch's (native: torch._scaled_grouped_mm), each beside bf16.
# Usage: bash scripts/map_session.sh [smoke] [tests] [qwen3-30b-a3b] [deepseek-v2-lite] [gpt-oss-120b] [deepseek-v3]
# A preset step runs both backends; PRESET/triton_ws or PRESET/native runs one. SAMPLES (default 3) sets the
# samples per stage. Runs go to results/<card>/map-PRESET-BACKEND.json, the heatmaps to
# plots/<card>/map-PRESET-BACKEND-fp8_rowwise.png, logs and a copy of each run under $OUT (the device tool's).
set -uo pipefail
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
mkdir -p "results/$CARD" "plots/$CARD"
SAMPLES=${SAMPLES:-3}
# DEADLINE (epoch seconds, optional): a map that would start with under a minute left is skipped, and a map running
# at the deadline gets SIGINT (mxbench keeps the cells done), so the device call ends inside its limit. Every file is
# also packed into $OUT/maps.tgz after each map: the device tool brings back at most 8 files.
mkdir -p "$OUT/m"

# Each model's grid: two G (the experts one GPU holds at two expert-parallel degrees) x three tokens per expert
# around the issue's 512-2048 (DeepSeek-V3: its coarse experts, 1024-4096, without the shared expert as the issue's
# 1.47x). 2 x 3 cells x (bf16, fp8_rowwise) = 12 layer points a run. The wide models take fewer experts a GPU
# (gpt-oss-120b's 128 at expert-parallel 8 and 4, DeepSeek-V3's 256 at 32 and 16) so that a map fits a device call.
grid() {
  case "$1" in
    qwen3-30b-a3b) echo "--experts 32,128 --tokens-per-expert 512,1024,2048" ;;
    deepseek-v2-lite) echo "--experts 16,64 --tokens-per-expert 512,1024,2048" ;;
    gpt-oss-120b) echo "--experts 16,32 --tokens-per-expert 512,1024,2048" ;;
    deepseek-v3) echo "--experts 8,16 --tokens-per-expert 1024,2048,4096 --shared-experts 0" ;;
    *) echo "" ;;
  esac
}

map_one() {  # PRESET BACKEND
  local name="map-$1-$2" start=$SECONDS budget
  budget=$(left)
  if [ "$budget" -lt 60 ]; then echo "$name: skipped, ${budget} s before the deadline" | tee -a "$OUT/m/timing.log"; return; fi
  # shellcheck disable=SC2046  # the grid's words are options
  timeout -s INT "$budget" mxbench map --preset "$1" $(grid "$1") --recipe fp8_rowwise --backend "$2" \
    --samples "$SAMPLES" --out "results/$CARD/$name.json" --plot-dir "plots/$CARD" 2>&1 | tee "$OUT/m/$name.log" | tail -22
  echo "$name: $((SECONDS - start)) s" | tee -a "$OUT/m/timing.log"
  cp "results/$CARD/$name.json" "results/$CARD/$name.csv" "plots/$CARD/$name"-*.png "$OUT/m/" 2>/dev/null
  pack maps.tgz m
}

for step in "$@"; do
  case "$step" in
    smoke)
      mxbench map --K 256 --N 128 --experts 4,8 --tokens-per-expert 128,256 --top-k 2 --recipe fp8_rowwise,mxfp8 \
        --samples 3 --out "$OUT/map-smoke.json" --plot-dir "$OUT" 2>&1 | tee "$OUT/smoke.log" | tail -30
      mxbench map --K 256 --N 128 --scope projection --experts 4,8 --tokens-per-expert 128,256 --recipe fp8_rowwise \
        --backend native --samples 3 --out "$OUT/map-smoke-projection.json" --plot-dir "$OUT" 2>&1 \
        | tee "$OUT/smoke-projection.log" | tail -12 ;;
    tests)
      python3 -m pytest -q -x tests/test_map.py 2>&1 | tee "$OUT/tests.log" | tail -5 ;;
    */*)
      map_one "${step%/*}" "${step#*/}" ;;
    *)
      [ -n "$(grid "$step")" ] || { echo "no grid for $step" >&2; exit 2; }
      map_one "$step" triton_ws
      map_one "$step" native ;;
  esac
done
