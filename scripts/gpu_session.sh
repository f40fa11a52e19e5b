#!/usr/bin/env bash
# One GPU session on the device machine: install, test, measure; every log and result lands under $OUT.
#   bash scripts/gpu_session.sh STEP...   (steps: env tests gputests quick ceilings peers roofline scout tune_gemm tune_layouts tune_quantize torchao)
# Reads the card's settings, never changes them (no power limit, clock or persistence changes).
set -u
OUT=${OUT:-/tmp/mxbench-out}
WORK=/tmp/mxbench-session  # logs and results; bundled into $OUT/bundle.tgz after every step
mkdir -p "$OUT" "$WORK/logs" "$WORK/results"
export TRITON_DEFAULT_FP_FUSION=1 PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -q -e . >"$WORK/logs/install.log" 2>&1 || { cat "$WORK/logs/install.log"; exit 1; }
RES="$WORK/results"

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/logs/NAME.log, report the status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  printf '%-10s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
  tail -n 25 "$WORK/logs/$name.log" >>"$OUT/summary.txt"
  tar -czf "$OUT/bundle.tgz" -C "$WORK" logs results
}

for s in "$@"; do
  case $s in
    env) step env 60 bash -c 'nvidia-smi; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"' ;;
    tests) step tests 900 python -m pytest -q -p no:cacheprovider -rfE --timeout 600 tests ;;
    gputests) step gputests ${GPUTESTS_LIMIT:-900} python -m pytest -q -p no:cacheprovider -rfE --timeout 600 -m gpu tests ;;
    ceilings) step ceilings ${CEILINGS_LIMIT:-300} mxbench ceilings --out-dir "$RES" ;;
    peers) step peers ${PEERS_LIMIT:-600} mxbench peers --preset deepseek-v3 --out "$RES/peers-deepseek-v3.json" ;;
    roofline) step roofline 900 mxbench roofline --K 7168 --N 2048 --out "$RES/roofline-deepseek-v3.json" --plot-file "$RES/roofline-deepseek-v3.png" ;;
    scout) step scout 900 mxbench roofline --preset llama4-scout --out "$RES/roofline-llama4-scout.json" ;;
    quick) step quick 200 mxbench roofline --K 7168 --N 2048 --M 131072 --samples 10 --out "$RES/quick-deepseek-v3.json" ;;
    tune_gemm) step tune_gemm 300 env OUT="$RES" python scripts/tune_gemm.py ;;
    tune_layouts) step tune_layouts 240 env OUT="$RES" python scripts/tune_layouts.py ;;
    tune_quantize) step tune_quantize 240 env OUT="$RES" python scripts/tune_quantize.py ;;
    torchao) step torchao 120 bash -c 'python -m pip install --no-deps -q .wheels/torchao-*.whl && python -c "import torchao; print(torchao.__version__)"' ;;
    *) echo "unknown step $s" ;;
  esac
done
cat "$OUT/summary.txt"
