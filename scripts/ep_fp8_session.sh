#!/usr/bin/env bash
# Issue 33 on one host with 2 GPUs (device kind nvidia-h200-x2, NCCL, NVLink multicast off), from the repository
# root: the whole MoE layer expert-parallel (`mxbench ep --layer`) in every strategy, FP8 rowwise included, balanced
# and skewed, without the shared expert and with it overlapped. Everything lands in $OUT: a log per step,
# summary.txt, each run's figure, and the runs (JSON + CSV) under $OUT/results/<card>/ep/ (commit them there, the
# figures under plots/).
#
#   OUT=/tmp/ep33 bash scripts/ep_fp8_session.sh env check                 # ~3 min
#   OUT=/tmp/ep33 bash scripts/ep_fp8_session.sh balanced                  # } one step a call: each is at most
#   OUT=/tmp/ep33 bash scripts/ep_fp8_session.sh balanced-shared           # } ~8 minutes (5 strategies), under the
#   OUT=/tmp/ep33 bash scripts/ep_fp8_session.sh skewed                    # } device's 10 minutes a command
#   OUT=/tmp/ep33 bash scripts/ep_fp8_session.sh skewed-shared             # }
#
# Steps: env (versions, topology); check (mxbench ep --layer --check on NCCL at a small size: every strategy, every
# stage against its oracle, the layer against the single-process reference, skewed top-2 routing so the padding paths
# run, one shared expert overlapped; prints the FP8 dispatch's SQNR); balanced / skewed (DeepSeek-V3's layer at EP 2:
# --preset deepseek-v3 = K 7168, N 2048, top-1, 8 local experts and 131072 tokens per rank, no shared expert);
# balanced-shared / skewed-shared (the same with its one shared expert in bf16 on a second stream: --overlap times
# the step overlapped, the record's step, and with the shared expert in line, telemetry.overlap: the gain).
# The runs go to $OUT/results/<card>/ep/ (the card as mxbench names it), as they are to be committed.
# STRATEGIES (default all five) picks the strategies; SHARED_IN_RECIPE=1 runs the shared expert in the recipe.
# A run whose CUDA-graph timing fails is rerun once with --timing events. Runs are named
# ep-layer-deepseek-v3-<groups>-ep<N>[-shared-overlap].json. Afterwards, per run:
#   mxbench table $OUT/results/<card>/ep/<run>.json --kind ep-summary   (the overlap's gain is a column there)
#   mxbench ep-project $OUT/results/<card>/ep/<run>.json --ep 8,16,32,64,128,256
#
# Memory per GPU: as scripts/ep_layer_session.sh says (about 50 of 141 GiB for the longest stage list), plus the
# shared expert's (T, 2N) and (T, N) intermediates (~1.5 GiB). Reads the cards' settings, never changes them.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
NPROC=${NPROC:-2}
TOKENS=${TOKENS:-131072}
SAMPLES=${SAMPLES:-10}
TIMING=${TIMING:-graph}
STRATEGIES=${STRATEGIES:-bf16,mxfp8,mxfp8_a2a,fp8_rowwise,fp8_rowwise_a2a}
SHARED_IN_RECIPE=${SHARED_IN_RECIPE:-}
export TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
INSTALL_LOG=$OUT/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack

RUNS="$OUT/results/$CARD/ep"
mkdir -p "$RUNS"

RUN_WIDTH=44
source "$(dirname "$0")/run_step.sh"  # run NAME SECONDS CMD...

measure() {  # measure GROUPS SHARED: the DeepSeek-V3 layer at EP $NPROC; events timing if graphs fail
  local groups=$1 shared=$2
  local name="ep-layer-deepseek-v3-$groups-ep$NPROC"
  local args=(--layer --preset deepseek-v3 --nproc "$NPROC" --experts 8 --tokens "$TOKENS" --groups "$groups"
              --strategy "$STRATEGIES" --samples "$SAMPLES")
  if [ "$shared" = 1 ]; then
    name="$name-shared-overlap"
    args+=(--shared-experts 1 --overlap ${SHARED_IN_RECIPE:+--shared-in-recipe})
    [ -n "$SHARED_IN_RECIPE" ] && name="$name-in-recipe"
  else
    args+=(--shared-experts 0)
  fi
  run "$name" 570 mxbench ep "${args[@]}" --timing "$TIMING" --out "$RUNS/$name.json" --plot-file "$OUT/$name.png"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$TIMING" = graph ]; then
    run "$name-events" 570 mxbench ep "${args[@]}" --timing events --out "$RUNS/$name-events.json" \
      --plot-file "$OUT/$name-events.png"
  fi
}

for step in ${@:-env check balanced balanced-shared skewed skewed-shared}; do
  case $step in
    env) run "env" 60 bash -c 'nvidia-smi; nvidia-smi topo -m; python -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"' ;;
    check) RUN_TAIL=60 run "check-ep$NPROC" 420 mxbench ep --layer --nproc "$NPROC" --check --K 1024 --N 512 \
             --experts 4 --tokens 4096 --top-k 2 --groups skewed --strategy "$STRATEGIES" --shared-experts 1 --overlap ;;
    balanced|skewed) measure "$step" 0 ;;
    balanced-shared|skewed-shared) measure "${step%-shared}" 1 ;;
    *) echo "unknown step $step" | tee -a "$OUT/summary.txt"; break ;;
  esac
done
cat "$OUT/summary.txt"
