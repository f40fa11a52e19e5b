#!/usr/bin/env bash
# One device call on a machine with one or two GPUs: steps run in lanes, one lane per GPU, side by side; a lane's
# steps run one after the other on its GPU (CUDA_VISIBLE_DEVICES). Everything a step writes under results/ and plots/
# of this checkout, its log and the tuning JSON are bundled into $OUT/bundle.tgz when the lanes end.
#   bash scripts/gpu_lanes.sh "LANE0 STEPS" ["LANE1 STEPS"]     e.g.  "ceilings roofline" "gputests tune_q"
# Each step has its own time limit (STEP_LIMITS below); MXBENCH_GIT_COMMIT names the commit of the copied tree.
# Reads the cards' settings, never changes them (no power limit, clock or persistence changes).
set -u
OUT=${OUT:-/tmp/mxbench-out}
LOGS=$OUT/logs
TUNE=$OUT/tune
mkdir -p "$LOGS" "$TUNE" plots
export TRITON_DEFAULT_FP_FUSION=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONPATH=$PWD/examples/plain_quantizer${PYTHONPATH:+:$PYTHONPATH}
INSTALL_LOG=$LOGS/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
if ls .wheels/torchao-*.whl >/dev/null 2>&1; then
  python -m pip install --no-deps -q .wheels/torchao-*.whl >>"$LOGS/install.log" 2>&1
fi
RES=results/$CARD
mkdir -p "$RES"

step() {  # step GPU NAME SECONDS CMD...: time-limited on one GPU, logged; a status line in $OUT/summary.txt
  local gpu=$1 name=$2 limit=$3 t0=$SECONDS; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout --kill-after=15 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  printf 'gpu%s %-16s rc=%-3s %4ss  %s\n' "$gpu" "$name" "$rc" "$((SECONDS - t0))" "$*" >>"$OUT/summary.txt"
  tail -n "${TAIL:-12}" "$LOGS/$name.log" | sed "s/^/  [$name] /" >>"$OUT/summary.txt"
}

run_step() {  # run_step GPU STEP
  local g=$1
  case $2 in
    env) step "$g" env 60 bash -c 'nvidia-smi; nvidia-smi topo -m; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.nccl.version())"' ;;
    gputests) step "$g" gputests 330 python -m pytest -q -p no:cacheprovider -rfE --timeout 300 -m gpu tests ;;
    ceilings) step "$g" ceilings 240 mxbench ceilings --out-dir results ;;
    roofline) step "$g" roofline 300 mxbench roofline --K 7168 --N 2048 --recipe mxfp8,fp8_rowwise --fuse-scales \
      --denominator measured --out "$RES/roofline-deepseek-v3.json" --plot-file "plots/$CARD/deepseek-v3" ;;
    fp8) step "$g" fp8 200 mxbench roofline --K 7168 --N 2048 --recipe fp8_rowwise --denominator measured \
      --out "$RES/roofline-deepseek-v3-fp8_rowwise.json" ;;
    roofline_big) step "$g" roofline_big 200 mxbench roofline --K 7168 --N 2048 --M 131072 --recipe mxfp8,fp8_rowwise \
      --fuse-scales --denominator measured --out "$RES/roofline-deepseek-v3.json" --plot-file "plots/$CARD/deepseek-v3" ;;
    scout) step "$g" scout 200 mxbench roofline --preset llama4-scout --M 131072 --recipe mxfp8,fp8_rowwise \
      --fuse-scales --denominator measured --out "$RES/roofline-llama4-scout.json" ;;
    peers) step "$g" peers 330 mxbench peers --preset deepseek-v3 --out "$RES/peers-deepseek-v3.json" ;;
    impl) step "$g" impl 150 mxbench roofline --K 7168 --N 2048 --M 16384 --impl quantize_a=plain_quantizer:quantize_a \
      --out "$RES/roofline-deepseek-v3-impl-plain.json" ;;
    check) step "$g" check 150 mxbench check --stage gemm_fwd,gemm_dgrad,gemm_wgrad,quantize_a,rearrange_a \
      --K 512 --N 256 --G 4 --M 4096 ;;
    baseline) step "$g" baseline 150 mxbench roofline --K 7168 --N 2048 --M 16384,32768 \
      --out "results/baselines/$CARD.json" ;;
    tune_q) step "$g" tune_q 200 python scripts/tune_fp8_and_fused_quantizers.py --out "$TUNE/tune_q.json" ;;
    tune_gemm) step "$g" tune_gemm 260 python scripts/tune_fused_gemm.py --profile --out "$TUNE/tune_gemm.json" ;;
    *) echo "unknown step $2" >>"$OUT/summary.txt" ;;
  esac
}

lane() {  # lane GPU STEPS...
  local g=$1; shift
  for s in "$@"; do run_step "$g" "$s"; done
}

pids=()
gpu=0
for steps in "$@"; do
  # shellcheck disable=SC2086  # a lane's steps are words
  lane "$gpu" $steps &
  pids+=($!)
  gpu=$((gpu + 1))
done
wait "${pids[@]}"
tar -czf "$OUT/bundle.tgz" -C "$OUT" logs tune -C "$PWD" results plots 2>/dev/null
cat "$OUT/summary.txt"
