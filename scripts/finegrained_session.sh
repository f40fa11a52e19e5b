#!/usr/bin/env bash
# The fine-grained MoE runs of issue 32 on one GPU machine (no network): install, the GPU tests of what changed, the
# quantizer and router tuning runs, the layer at the four fine-grained and coarse presets (the maps:
# scripts/map_session.sh).
# Usage: bash scripts/finegrained_session.sh [tests] [quant] [weightquant] [fused] [alone] [fineamax] [router]
#   [layers] [coarse[/PRESET]] [wgrad[/PRESET]] [step]
# Runs go to results/<card>/ and plots/<card>/; everything written there is packed into $OUT/results.tgz (the device
# tool brings back few files) after every step, logs beside it. SAMPLES (default 5) sets the samples per stage.
# DEADLINE (epoch seconds): a step is cut short at it, and a step with under 20 s left is skipped.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
mkdir -p "results/$CARD/tuning" "plots/$CARD"
SAMPLES=${SAMPLES:-5}
TAG=${TAG:+-$TAG}  # a suffix for the layer runs' files, so that a re-measure keeps the runs the perf log cites
PRESETS="qwen3-30b-a3b deepseek-v2-lite gpt-oss-120b deepseek-v3"
touch /tmp/session-start
within() { local cap=$1 budget; budget=$(left); echo $((budget < cap ? budget : cap)); }  # a step's time limit

for step in "$@"; do
  start=$SECONDS
  if [ "$(left)" -lt 20 ]; then echo "== $step: skipped, $(left) s before the deadline" | tee -a "$OUT/timing.log"; continue; fi
  case "$step" in
    tests)
      # The GPU tests of what issues 32 and 34 changed (the kernels' whole GPU set: `pytest -m gpu kernels/tests`).
      # GPU_TESTS (optional) names other test files instead.
      # shellcheck disable=SC2086  # the files' words
      timeout "$(within 300)" python3 -m pytest -q -p no:cacheprovider -m gpu ${GPU_TESTS:-tests/test_timing_cheats.py \
        tests/test_check_apart.py tests/test_map.py kernels/tests/test_gate_grad.py} 2>&1 | tee "$OUT/tests.log" | tail -8 ;;
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
    weightquant)  # the weight quantizers' candidates at the fine-grained shapes (scripts/tune_weight_quantizers.py)
      timeout -s INT "$(within 220)" python3 scripts/tune_weight_quantizers.py --budget-s 150 \
        --out "results/$CARD/tuning/tune_weight_quantizers.json" > "$OUT/weightquant.log" 2>&1; tail -40 "$OUT/weightquant.log" ;;
    fused)  # the fused layer stages at the fine-grained widths against their chains (scripts/tune_layer_fused.py)
      timeout -s INT "$(within 400)" python3 scripts/tune_layer_fused.py --compile-jobs 14 --budget-s 250 --samples 5 \
        --out "results/$CARD/tuning/tune_layer_fused-finegrained.json" > "$OUT/fused.log" 2>&1; grep -v Warning "$OUT/fused.log" | tail -30 ;;
    alone)  # the FP8 fused calls without the column amax table (--wgrad bf16's) against the plain quantizer's chain
      timeout -s INT "$(within 300)" python3 scripts/tune_layer_fused.py --recipes fp8_alone --compile-jobs 14 \
        --budget-s 180 --samples 5 --out "results/$CARD/tuning/tune_layer_fused-alone$TAG.json" > "$OUT/alone.log" 2>&1
      grep -v Warning "$OUT/alone.log" | tail -30 ;;
    coarse|coarse/*)  # DeepSeek-V3 and Llama 4 Scout without the shared expert (the issue's 1.47x / 1.63x), chains and fused
      presets=$([ "$step" = coarse ] && echo "deepseek-v3 llama4-scout" || echo "${step#coarse/}")
      for p in $presets; do
        timeout -s INT "$(within 200)" mxbench layer --preset "$p" --shared-experts 0 --recipe fp8_rowwise --fuse \
          --samples "$SAMPLES" --out "results/$CARD/layer-$p-no-shared$TAG.json" 2>&1 \
          | grep -v "Warning\|t = self" | tee "$OUT/layer-$p-no-shared$TAG.log" | grep -A6 "^Model"; done ;;
    fineamax)  # the fused-scale weight quantizers (along K with the table, along N from it) at the fine-grained weights
      timeout -s INT "$(within 170)" python3 scripts/tune_fp8_and_fused_quantizers.py --only fine_amax --budget-s 130 \
        --samples 5 --out "results/$CARD/tuning/tune_fp8_and_fused_quantizers-fine-amax.json" > "$OUT/fineamax.log" 2>&1
      tail -30 "$OUT/fineamax.log" ;;
    wgrad|wgrad/*)  # the layer with its weight gradients in bf16 (--wgrad bf16), fused stages, 8 microbatches
      presets=$([ "$step" = wgrad ] && echo "qwen3-30b-a3b deepseek-v2-lite gpt-oss-120b" || echo "${step#wgrad/}")
      for p in $presets; do
        timeout -s INT "$(within 200)" mxbench layer --preset "$p" --recipe fp8_rowwise --wgrad bf16 --fuse \
          --microbatches 8 --samples "$SAMPLES" --out "results/$CARD/layer-$p-wgrad-bf16$TAG.json" 2>&1 \
          | grep -v "Warning\|t = self" | tee "$OUT/layer-$p-wgrad-bf16$TAG.log" | grep -A5 "^Model"; done ;;
    step)  # issue 34: the FP8 rowwise step with torch's GEMM and ours against one bf16 baseline (DeepSeek-V3)
      timeout -s INT "$(within 330)" python3 scripts/step_backends.py --preset deepseek-v3 --M 131072 \
        --recipe fp8_rowwise --backends native,triton_ws --fuse-scales --fused-only --denominator measured \
        --samples "$SAMPLES" \
        --out-dir "results/$CARD" 2>&1 | grep -v "Warning\|t = self" | tee "$OUT/step.log" | tail -12 ;;
    *) echo "unknown step $step" >&2 ;;
  esac
  echo "== $step: $((SECONDS - start)) s" | tee -a "$OUT/timing.log"
  find results plots -newer /tmp/session-start -type f | tar czf "$OUT/results.tgz" -T -
done
tar tzf "$OUT/results.tgz"
