#!/usr/bin/env bash
# Our FP8 rowwise grouped GEMMs against torch's on one Hopper GPU (issue 25; device kind nvidia-h100-x1), from the
# repository root. Everything lands in $OUT: a log per step and summary.txt, each run's JSON.
#
#   OUT=/tmp/g MXBENCH_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/fp8_gemm_session.sh env tests tune
#
# Steps: env (card, clocks, power as found, versions), tests (the GPU tests of both FP8 rowwise kernels: against the
# oracle with ragged, empty, tiny and unaligned groups, at model sizes against torch's SQNR, CUDA-graph capture),
# related (the GPU tests of what the FP8 rowwise default reaches), gate (the regression gate's GPU test), alltests
# (every GPU test: over 10 minutes),
# tune (scripts/tune_fp8_gemm.py: torch's kernel with both accumulations, the dense _scaled_mm, our candidates;
# TUNE_ARGS adds options, e.g. --quick), step (the FP8 rowwise fwd+bwd step over bf16 with the backends in
# STEP_BACKENDS at DeepSeek-V3 and Llama 4 Scout, M = 131072, fused scales: `mxbench roofline ... --backend`),
# deepgemm (the DeepGEMM peer, its own 1x128/128x128 recipe: needs .peers/lib/libmxdg.so built beside the checkout by
# scripts/peers/build_deepgemm.sh and carried; its GPU tests, then scripts/tune_fp8_gemm.py --only-deepgemm for fwd
# and dgrad, then wgrad's k-grouped kernel in a process of its own -- run it last: a fault ends only its own step).
# Reads the card's settings, never changes them.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
TUNE_ARGS=${TUNE_ARGS:-}
STEP_BACKENDS=${STEP_BACKENDS:-native triton_ws}
export TRITON_DEFAULT_FP_FUSION=1
INSTALL_LOG=$OUT/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
source "$(dirname "$0")/run_step.sh"  # run NAME SECONDS CMD...

for step in "${@:-env tests tune}"; do
  case $step in
    env)
      run env 60 bash -c 'nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,clocks.sm --format=csv;
        python -c "import torch, triton; print(torch.__version__, triton.__version__)"' ;;
    tests)
      run tests 420 python -m pytest -q -m gpu kernels/tests/test_gemm_fp8_ws.py kernels/tests/test_gemm_fp8_rowwise.py ;;
    related)  # the GPU tests of everything the FP8 rowwise default backend reaches: steps, layers, sweeps, guards
      run related 540 python -m pytest -q -m gpu kernels/tests/test_gemm_dispatch.py kernels/tests/test_gemm_mx_triton.py kernels/tests/test_gemm_dequant.py kernels/tests/test_gemm_front_door.py kernels/tests/test_gemm_native.py kernels/tests/test_pipeline.py tests/test_layer.py \
        kernels/tests/test_moe_layer_gpu.py tests/test_sweep.py kernels/tests/test_native_guards.py kernels/tests/test_fp8_rowwise.py \
        kernels/tests/test_fp8_amax.py ;;
    gate)  # the regression gate catching a planted 10% slowdown of an outside kernel (~7 minutes)
      run gate 540 python -m pytest -q -m gpu tests/test_gate_scripts.py ;;
    alltests)  # every GPU test of the suite (what the SM90 default backend reaches: steps, layers, autograd)
      run alltests 540 python -m pytest -q -m gpu -x tests/ ;;
    tune)
      # shellcheck disable=SC2086  # TUNE_ARGS is a list of options
      run tune 540 python scripts/tune_fp8_gemm.py --out "$OUT/tune_fp8_gemm.json" --budget-s 420 $TUNE_ARGS ;;
    step)  # every backend in one invocation against one bf16 baseline (scripts/step_backends.py)
      for preset in deepseek-v3 llama4-scout; do
        run "step-$preset" 600 python scripts/step_backends.py --preset "$preset" --M 131072 --recipe fp8_rowwise \
          --backends "${STEP_BACKENDS// /,}" --fuse-scales --denominator measured --samples 10 --out-dir "$OUT/results"
      done ;;
    deepgemm)
      run deepgemm-lib 60 bash scripts/peers/build_deepgemm.sh --check || continue
      run deepgemm-tests 300 python -m pytest -q -m gpu tests/test_peer_deepgemm.py
      run deepgemm-tune 420 python scripts/tune_fp8_gemm.py --only-deepgemm --out "$OUT/tune_fp8_gemm-deepgemm.json"
      run deepgemm-wgrad 300 python scripts/tune_fp8_gemm.py --only-deepgemm --deepgemm-passes wgrad \
        --out "$OUT/tune_fp8_gemm-deepgemm-wgrad.json" ;;
    *) echo "unknown step $step (env tests related gate alltests tune step deepgemm)"; exit 2 ;;
  esac
done
cat "$OUT/summary.txt"
