#!/usr/bin/env bash
# The expert-parallel runs of issue 12 on one host with 2 GPUs (device kinds nvidia-h100-x2 / nvidia-h200-x2), from
# the repository root. Everything lands in $OUT: a log per step, summary.txt, each run's JSON + CSV + figure, and
# results/ (a copy of the committed ceilings with this host's all-to-all ceiling added: commit the new files).
#
#   OUT=/tmp/ep bash scripts/gpu_ep.sh                      # every step, about 7 minutes
#   OUT=/tmp/ep bash scripts/gpu_ep.sh check ceiling dsv3   # ~3.5 min  } two calls when a command may run
#   OUT=/tmp/ep bash scripts/gpu_ep.sh llama4 skewed        # ~3.5 min  } 10 minutes at most
#
# Steps: env (versions, nvidia-smi topo -m), check (mxbench ep --check on NCCL: every stage against its oracle and
# the layer against the single-process reference, skewed top-2 routing so the padding paths run), ceiling (the
# measured all-to-all ceiling), dsv3 / llama4 (DeepSeek-V3 K=7168 N=2048 and Llama-4-like K=8192 N=5120, 8 local
# experts, 131072 tokens per rank, bf16, mxfp8, mxfp8_a2a), skewed (DeepSeek-V3 with skewed routing).
# A measurement whose CUDA-graph timing fails (an NCCL capture can poison the communicator) is rerun once with
# --timing events, unless it ran out of time (a poisoned communicator hangs: then rerun the steps with TIMING=events).
#
# Memory per GPU, the larger shape (Llama-4-like, K=8192, N=5120, T=131072, top-k 1): a (T, K) bf16 activation is
# 2 GiB, (T, N) 1.25 GiB, the weights 0.6 GiB. Timing stage by stage holds the intermediates of one eager step
# (mxfp8, the largest list): ~6 (T, K) and ~8 (T, N) bf16 tensors, their fp8 copies and the weights' = ~28 GiB,
# plus what one GEMM allocates inside (the SM90 MXFP8 backend dequantizes its operands to bf16: <= 5 GiB), plus
# NCCL's buffers: under 40 GiB of 80. They are freed before the fwd+bwd step is timed (~25 GiB with its saved
# tensors). Reads the cards' settings, never changes them. NVLink multicast stays off (kept where set, else 0 / 1).
set -u
OUT=${OUT:?set OUT to the folder the results go to}
NPROC=${NPROC:-2}
SAMPLES=${SAMPLES:-10}
TIMING=${TIMING:-graph}  # TIMING=events if the ceiling step's log shows that NCCL all-to-alls cannot be captured
export TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
INSTALL_LOG=$OUT/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack
RES=$OUT/results  # the committed per-card ceilings (the runs' denominators); the all-to-all ceiling is added here
for f in results/*/ceilings.json results/*/alltoall_ceilings.json; do
  [ -f "$f" ] && [ ! -f "$RES/${f#results/}" ] && mkdir -p "$RES/$(dirname "${f#results/}")" && cp "$f" "$RES/${f#results/}"
done

RUN_WIDTH=26
source "$(dirname "$0")/run_step.sh"  # run NAME SECONDS CMD...

measure() {  # measure NAME ARGS...: one mxbench ep run of the issue's layer; events timing if graphs fail
  local name=$1; shift
  local args=(--nproc "$NPROC" --experts 8 --tokens 131072 --strategy bf16,mxfp8,mxfp8_a2a --samples "$SAMPLES"
              --results-dir "$RES" --out "$OUT/$name.json" --plot-file "$OUT/$name.png" --timing "$TIMING" "$@")
  run "$name" 240 mxbench ep "${args[@]}"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$TIMING" = graph ]; then
    run "$name-events" 240 mxbench ep "${args[@]}" --timing events --out "$OUT/$name-events.json" \
      --plot-file "$OUT/$name-events.png"
  fi
}

for step in "${@:-env check ceiling dsv3 llama4 skewed}"; do
  for s in $step; do
    case $s in
      env) run env 60 bash -c 'nvidia-smi; nvidia-smi topo -m; env | grep -E "^(NCCL|TORCH_SYMM|CUDA_VISIBLE)"; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"' ;;
      check) run check 240 mxbench ep --nproc "$NPROC" --check --K 1024 --N 512 --experts 4 --tokens 4096 --top-k 2 --groups skewed ;;
      ceiling) run ceiling 150 python -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m mxbench ceilings --out-dir "$RES" ;;
      dsv3) measure ep-deepseek-v3 --K 7168 --N 2048 ;;
      llama4) measure ep-llama4 --K 8192 --N 5120 ;;
      skewed) measure ep-deepseek-v3-skewed --K 7168 --N 2048 --groups skewed ;;
      *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
    esac
  done
done
cat "$OUT/summary.txt"
