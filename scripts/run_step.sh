# Sourced by the device session scripts that run steps this way (gpu_ep.sh, gpu_shard.sh, ep_layer_session.sh,
# ep_fp8_session.sh, fp8_gemm_session.sh), after session_common.sh:
# run NAME SECONDS CMD...: CMD time-limited, its output in $OUT/NAME.log, a status line (the name padded to
# RUN_WIDTH, default 26) in $OUT/summary.txt, then the log's last RUN_TAIL lines there too (default none).
run() {
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  timeout --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf "%-${RUN_WIDTH:-26}s rc=%-3s %4ss  %s\n" "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
  if [ "${RUN_TAIL:-0}" -gt 0 ]; then tail -n "$RUN_TAIL" "$OUT/$name.log" >>"$OUT/summary.txt"; fi
  return "$rc"
}
