#!/usr/bin/env bash
# One GPU session on the device machine: install, test, measure. Results are written under results/<card>/ of
# this checkout (the commands recorded in them are the ones to rerun); logs, results and plots are bundled into
# $OUT/bundle.tgz after every step.
#   bash scripts/gpu_session.sh STEP...
# Reads the card's settings, never changes them (no power limit, clock or persistence changes).
# The torchao step installs a wheel from .wheels/ (pip download --no-deps torchao==0.17.0 -d .wheels), for machines
# without network; MXBENCH_GIT_COMMIT names the commit when the tree arrives without .git.
set -u
OUT=${OUT:-/tmp/mxbench-out}
LOGS=/tmp/mxbench-logs
mkdir -p "$LOGS"
export TRITON_DEFAULT_FP_FUSION=1
INSTALL_LOG=$LOGS/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
RES=results/$CARD
TUNE=/tmp/mxbench-tune  # tuning-script JSON: evidence for the perf log, not results
mkdir -p "$RES" "$TUNE" plots

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $LOGS/NAME.log, report the status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  printf '%-13s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
  tail -n "${TAIL:-25}" "$LOGS/$name.log" >>"$OUT/summary.txt"
  tar -czf "$OUT/bundle.tgz" -C / "${LOGS#/}" "${TUNE#/}" -C "$PWD" results plots
}

for s in "$@"; do
  case $s in
    env) step env 60 bash -c 'nvidia-smi; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"' ;;
    tests) step tests 900 python -m pytest -q -p no:cacheprovider -rfE --timeout 600 tests kernels/tests ;;
    gputests) step gputests "${GPUTESTS_LIMIT:-420}" python -m pytest -q -p no:cacheprovider -rfE --timeout 600 -m gpu tests kernels/tests ;;
    torchao) step torchao 120 bash -c 'python -m pip install --no-deps -q .wheels/torchao-*.whl && python -c "import torchao; print(torchao.__version__)"' ;;
    ceilings) step ceilings 480 mxbench ceilings --out-dir results ;;
    roofline) step roofline 500 mxbench roofline --K 7168 --N 2048 --out "$RES/roofline-deepseek-v3.json" --plot-file plots/deepseek-v3 ;;
    scout) step scout "${SCOUT_LIMIT:-500}" mxbench roofline --preset llama4-scout --M 131072 --recipe mxfp8,fp8_rowwise --out "$RES/roofline-llama4-scout.json" --denominator measured --fuse-scales ;;
    fp8) step fp8 "${FP8_LIMIT:-400}" mxbench roofline --K 7168 --N 2048 --recipe fp8_rowwise --out "$RES/roofline-deepseek-v3-fp8_rowwise.json" --denominator measured --fuse-scales ;;
    skewed) step skewed 300 mxbench roofline --K 7168 --N 2048 --M 131072 --groups skewed --out "$RES/roofline-deepseek-v3-skewed.json" ;;
    peers) step peers 500 mxbench peers --preset deepseek-v3 --out "$RES/peers-deepseek-v3.json" ;;
    peers_scout) step peers_scout 500 mxbench peers --preset llama4-scout --out "$RES/peers-llama4-scout.json" ;;
    baseline) step baseline 300 make baseline ;;
    regress) step regress 500 make regress ;;
    quick) step quick 200 mxbench roofline --K 7168 --N 2048 --M 131072 --samples 10 --out /tmp/quick.json ;;
    tune_gemm) step tune_gemm 300 env OUT="$TUNE" python scripts/tune_gemm.py ;;
    tune_fused_gemm) step tune_fused_gemm 360 python scripts/tune_fused_gemm.py --profile --out "$TUNE/tune_fused_gemm.json" ;;
    tune_layouts) step tune_layouts 240 env OUT="$TUNE" python scripts/tune_layouts.py ;;
    tune_quantize) step tune_quantize 240 env OUT="$TUNE" python scripts/tune_quantize.py ;;
    aa_spread) step aa_spread 580 python scripts/measure_aa_spread.py --out "$OUT/aa-spread" ;;
    outside_slowdown) step outside_slowdown 580 python scripts/regress_outside_slowdown.py --out "$OUT/outside-slowdown" ;;
    tune_amax) step tune_amax 330 python scripts/tune_fp8_and_fused_quantizers.py --only amax --budget-s 280 --out "$TUNE/tune_fp8_and_fused_quantizers-amax.json" ;;
    gputests_fp8) step gputests_fp8 200 python -m pytest -q -p no:cacheprovider -rfE --timeout 180 -m gpu kernels/tests/test_fp8_amax.py kernels/tests/test_fp8_rowwise.py kernels/tests/test_pipeline.py tests/test_check.py ;;
    *) echo "unknown step $s" ;;
  esac
done
cat "$OUT/summary.txt"
