#!/usr/bin/env bash
# The MoE layer runs on a GPU machine (no network): install, the layer's GPU tests, then `mxbench layer` per preset.
# Usage: bash scripts/layer_session.sh [smoke] [tests] [deepseek-v3] [deepseek-v3/shared] [llama4-scout] ...
# PRESET/shared runs the shared experts in the recipe too (--shared-in-recipe), stored as layer-PRESET-shared-in-recipe.
# Results and figures go to results/<card>/ and plots/<card>/, logs and a copy of each run under $OUT (the device
# tool's); the figures are redrawn from the runs with `mxbench plot`.
set -uo pipefail
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
mkdir -p "results/$CARD" "plots/$CARD"
SAMPLES=${SAMPLES:-10}
for step in "$@"; do
  case "$step" in
    smoke)
      mxbench layer --K 256 --N 128 --tokens 4096 --experts 4 --top-k 2 --shared-experts 1 --routing skewed --fuse \
        --samples 3 --out "$OUT/layer-smoke.json" 2>&1 | tee "$OUT/smoke.log" | tail -30 ;;
    tests)
      python3 -m pytest -q -x tests/test_layer.py kernels/tests/test_moe_rows.py kernels/tests/test_swiglu.py kernels/tests/test_moe_fused.py \
        2>&1 | tee "$OUT/tests.log" | tail -15 ;;
    */shared)
      preset=${step%/shared}; name="layer-$preset-shared-in-recipe"
      mxbench layer --preset "$preset" --shared-in-recipe --recipe fp8_rowwise,mxfp8 --fuse --samples "$SAMPLES" \
        --out "results/$CARD/$name.json" --plot-file "plots/$CARD/$name.png" 2>&1 | tee "$OUT/$name.log" | tail -14
      cp "results/$CARD/$name.json" "$OUT/" ;;
    *)
      mxbench layer --preset "$step" --recipe fp8_rowwise,mxfp8 --fuse --samples "$SAMPLES" \
        --out "results/$CARD/layer-$step.json" --plot-file "plots/$CARD/layer-$step.png" 2>&1 | tee "$OUT/$step.log" | tail -14
      cp "results/$CARD/layer-$step.json" "$OUT/" ;;
  esac
done
