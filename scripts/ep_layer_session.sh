#!/usr/bin/env bash
# The whole MoE layer expert-parallel (`mxbench ep --layer`, issue 24) on one host with several GPUs (device kinds
# nvidia-h100-x2 / -x4), from the repository root. Everything lands in $OUT: a log per step, summary.txt, each run's
# JSON + CSV + figure.
#
#   OUT=/tmp/epl NPROC=2,4 bash scripts/ep_layer_session.sh                  # check, then balanced and skewed at each
#   OUT=/tmp/epl NPROC=2 bash scripts/ep_layer_session.sh check balanced     # one step list per call (10 min a call)
#   OUT=/tmp/epl NPROC=4 TOPK=2 bash scripts/ep_layer_session.sh skewed      # later: top-k > 1
#   OUT=/tmp/epl NPROC=2 WGRAD=recipe bash scripts/ep_layer_session.sh balanced   # mxfp8 vs mxfp8_a2a at one wgrad
#
# Steps: env (versions, topology), check (mxbench ep --layer --check on NCCL at a small size: every stage against its
# oracle and the whole layer against the single-process reference, skewed top-2 routing so the padding paths run),
# balanced / skewed (DeepSeek-V3's layer: --preset deepseek-v3 = K 7168, N 2048, top-1, sigmoid scores before the
# experts; 8 local experts and 131072 tokens per rank, as the projection runs in results/*/ep-*.json; strategies
# bf16, mxfp8, mxfp8_a2a; shared experts left out), for each EP degree in NPROC (a comma list).
# Each run is saved as $OUT/ep-layer-deepseek-v3-<groups>-ep<N>[-top<k>][-wgrad-<w>].json; a run whose CUDA-graph
# timing fails is rerun once with --timing events.
#
# Memory per GPU (mxfp8, the longest stage list, balanced top-1): timing stage by stage holds every intermediate of
# one eager step: the stages' declared bytes written sum to 36 GiB (bf16 30, mxfp8_a2a 33; mostly (T, K) bf16 copies
# of 1.75 GiB: sorted, received, permuted, the down projection's output through the combine, their gradients), plus
# x, dy and the weights (~4.5 GiB), what one MXFP8 GEMM allocates inside (<= 5 GiB) and NCCL's buffers: about 50 of
# 80 GiB. They are freed before the fwd+bwd step is timed; no reference runs in a measured run. Skewed routing: the hottest rank receives
# more rows (its recorded send counts say how many); TOKENS=65536 halves everything if a skewed run runs out.
# Reads the cards' settings, never changes them. NVLink multicast stays off (kept where set, else 0 / 1).
set -u
OUT=${OUT:?set OUT to the folder the results go to}
NPROC=${NPROC:-2}
TOPK=${TOPK:-1}
TOKENS=${TOKENS:-131072}
SAMPLES=${SAMPLES:-10}
TIMING=${TIMING:-graph}
WGRAD=${WGRAD:-}  # empty: each strategy's default (mxfp8: recipe, mxfp8_a2a: bf16); recipe or bf16 for all
export TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
INSTALL_LOG=$OUT/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack

RUN_WIDTH=40
source "$(dirname "$0")/run_step.sh"  # run NAME SECONDS CMD...

measure() {  # measure NPROC GROUPS: the DeepSeek-V3 layer at that EP degree; events timing if graphs fail
  local nproc=$1 groups=$2
  local name="ep-layer-deepseek-v3-$groups-ep$nproc"
  [ "$TOPK" != 1 ] && name="$name-top$TOPK"
  [ -n "$WGRAD" ] && name="$name-wgrad-$WGRAD"
  local args=(--layer --preset deepseek-v3 --nproc "$nproc" --experts 8 --tokens "$TOKENS" --top-k "$TOPK"
              --groups "$groups" --strategy bf16,mxfp8,mxfp8_a2a --samples "$SAMPLES" ${WGRAD:+--wgrad "$WGRAD"}
              --shared-experts 0)  # as before issue 33 (scripts/ep_fp8_session.sh runs the shared expert)
  run "$name" 480 mxbench ep "${args[@]}" --timing "$TIMING" --out "$OUT/$name.json" --plot-file "$OUT/$name.png"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$TIMING" = graph ]; then
    run "$name-events" 480 mxbench ep "${args[@]}" --timing events --out "$OUT/$name-events.json" \
      --plot-file "$OUT/$name-events.png"
  fi
}

for step in ${@:-env check balanced skewed}; do
  for nproc in ${NPROC//,/ }; do
    case $step in
      env) run "env" 60 bash -c 'nvidia-smi; nvidia-smi topo -m; python -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"'
           break ;;
      check) run "check-ep$nproc" 420 mxbench ep --layer --nproc "$nproc" --check --K 1024 --N 512 --experts 4 \
               --tokens 4096 --top-k 2 --groups skewed ;;
      balanced|skewed) measure "$nproc" "$step" ;;
      *) echo "unknown step $step" | tee -a "$OUT/summary.txt"; break ;;
    esac
  done
done
cat "$OUT/summary.txt"
