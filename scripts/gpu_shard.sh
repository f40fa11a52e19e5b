#!/usr/bin/env bash
# A sharded 2-GPU sweep against the single-GPU sweep (issue 12, item 6), on one host with 2 GPUs of one model
# (device kinds nvidia-h100-x2 / nvidia-h200-x2), from the repository root. Everything lands in $OUT: a log per
# step, summary.txt, and the runs as JSON + CSV.
#
#   OUT=/tmp/shard bash scripts/gpu_shard.sh                  # env single sharded compare gpu1 noise: ~7 minutes
#   OUT=/tmp/shard bash scripts/gpu_shard.sh single sharded compare  # the claim alone: ~4 minutes
#
# Steps: env (versions, nvidia-smi), single (the DeepSeek-V3 roofline sweep on GPU 0), sharded (the same sweep by
# torchrun over both GPUs: M=131072 on rank 0, the three smaller M on rank 1, each with its bf16 baseline), compare
# (`mxbench compare single sharded`: every stage matched; within noise = no SLOWER, exit 0), gpu1 + noise (the
# single sweep again on GPU 1 alone, compared with GPU 0's: how far two cards of one model differ by themselves, the
# noise the sharded run is held to), peers (the peers table sharded over both GPUs). Reads the cards' settings,
# never changes them; the sharded run uses no NCCL (gloo moves its records), multicast settings are kept as found.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
SWEEP=(roofline --K 7168 --N 2048 --M "${SHARD_M:-16384,32768,65536,131072}" --samples "${SAMPLES:-25}")
export TRITON_DEFAULT_FP_FUSION=1
INSTALL_LOG=$OUT/install.log
source "$(dirname "$0")/session_common.sh"  # refuses a stale commit; OUT, install, CARD, left, pack

RUN_WIDTH=10 RUN_TAIL=${TAIL:-4}
source "$(dirname "$0")/run_step.sh"  # run NAME SECONDS CMD...

for step in "${@:-env single sharded compare gpu1 noise}"; do
  for s in $step; do
    case $s in
      env) run env 60 bash -c 'nvidia-smi; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.version.cuda, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"' ;;
      single) run single 300 env CUDA_VISIBLE_DEVICES=0 mxbench "${SWEEP[@]}" --out "$OUT/single.json" ;;
      sharded) run sharded 300 python -m torch.distributed.run --standalone --nproc-per-node 2 -m mxbench "${SWEEP[@]}" --out "$OUT/sharded.json" ;;
      compare) run compare 60 mxbench compare "$OUT/single.json" "$OUT/sharded.json" ;;
      gpu1) run gpu1 300 env CUDA_VISIBLE_DEVICES=1 mxbench "${SWEEP[@]}" --out "$OUT/single-gpu1.json" ;;
      noise) run noise 60 mxbench compare "$OUT/single.json" "$OUT/single-gpu1.json" ;;
      peers) run peers 400 python -m torch.distributed.run --standalone --nproc-per-node 2 -m mxbench peers --preset deepseek-v3 --out "$OUT/peers-sharded.json" ;;
      *) echo "unknown step $s" | tee -a "$OUT/summary.txt" ;;
    esac
  done
done
cat "$OUT/summary.txt"
