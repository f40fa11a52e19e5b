#!/usr/bin/env bash
# The fine-grained MoE runs of issue 32 on one GPU machine (no network): install, the GPU tests of what changed, the
# quantizer and router tuning runs, the layer at the four fine-grained and coarse presets, then the maps.
# Usage: bash scripts/finegrained_session.sh [tests] [quant] [router] [layers] [maps] [maps-native]
# Runs go to results/<card>/ and plots/<card>/; everything written there is packed into $OUT/results.tgz (the device
# tool brings back few files), logs beside it. SAMPLES (default 5) sets the samples per stage.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
mkdir -p "results/$CARD/tuning" "plots/$CARD"
SAMPLES=${SAMPLES:-5}
PRESETS="qwen3-30b-a3b deepseek-v2-lite gpt-oss-120b deepseek-v3"
touch /tmp/session-start

# The map's grid per model: two G (the experts one GPU holds at two expert-parallel degrees) x three tokens per
# expert around the fine-grained 512-2048 (DeepSeek-V3: its coarse experts, without the shared expert).
grid() {
  case "$1" in
    deepseek-v3) echo "--experts 8,32 --tokens-per-expert 1024,4096,8192 --shared-experts 0" ;;
    deepseek-v2-lite) echo "--experts 16,64 --tokens-per-expert 512,1024,2048" ;;
    *) echo "--experts 32,128 --tokens-per-expert 512,1024,2048" ;;
  esac
}

for step in "$@"; do
  start=$SECONDS
  case "$step" in
    tests)
      # The GPU tests of what issues 32 and 34 changed (the kernels' whole GPU set: `pytest -m gpu kernels/tests`).
      timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_timing_cheats.py tests/test_check_apart.py \
        tests/test_map.py kernels/tests/test_gate_grad.py 2>&1 | tee "$OUT/tests.log" | tail -8 ;;
    quant)
      timeout 170 python3 scripts/tune_fp8_and_fused_quantizers.py --only fine --budget-s 120 --samples 10 \
        --out "results/$CARD/tuning/tune_fp8_and_fused_quantizers-fine.json" > "$OUT/quant.log" 2>&1; tail -25 "$OUT/quant.log" ;;
    router)
      timeout 90 python3 scripts/tune_router_grad.py --only deepseek-v3,qwen3-30b-a3b,gpt-oss-120b,deepseek-v2-lite \
        --out "results/$CARD/tuning/tune_router_grad.json" > "$OUT/router.log" 2>&1; grep -v Warning "$OUT/router.log" | tail -8 ;;
    layers)
      for p in $PRESETS; do
        timeout 150 mxbench layer --preset "$p" --recipe fp8_rowwise --microbatches 8 --samples "$SAMPLES" \
          --out "results/$CARD/layer-$p.json" 2>&1 | grep -v "Warning\|t = self" | tee "$OUT/layer-$p.log" | grep -A3 "^Model" ; done ;;
    maps|maps-native)
      backend=$([ "$step" = maps ] && echo "" || echo "--backend native")
      suffix=$([ "$step" = maps ] && echo "" || echo "-native")
      for p in $PRESETS; do
        # shellcheck disable=SC2046,SC2086  # the grid's and backend's words are options
        timeout 150 mxbench map --preset "$p" $(grid "$p") --recipe fp8_rowwise $backend --samples 3 \
          --out "results/$CARD/map-$p$suffix.json" --plot-dir "plots/$CARD" 2>&1 | grep -v "Warning\|t = self" \
          | tee "$OUT/map-$p$suffix.log" | tail -8; done ;;
    *) echo "unknown step $step" >&2 ;;
  esac
  echo "== $step: $((SECONDS - start)) s" | tee -a "$OUT/timing.log"
done
find results plots -newer /tmp/session-start -type f | tar czf "$OUT/results.tgz" -T - && tar tzf "$OUT/results.tgz"
