#!/usr/bin/env bash
# Builds .peers/lib/libmxdg.so: our host launcher (scripts/peers/deepgemm_launcher.cu) around DeepGEMM's SM90 FP8
# grouped GEMM, for sm_90a, with the CUDA compiler found (CUDA >= 12.8; checked with 13.0). Fetches nothing: the
# third-party sources must already be in .peers/src (ignored by git):
#   .peers/src/DeepGEMM   deepseek-ai/DeepGEMM 54e22612409371d6364144b69086735beb54e98b (deep_gemm/include, csrc)
#   .peers/src/cutlass    NVIDIA/cutlass f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 (DeepGEMM's submodule pin;
#                         include/cute, include/cutlass)
# Options: --check  only verify an existing .so (entry points and sm_90a) and build it when missing;
#          --generic-only  compile the generic instance alone (a ~30 s compile check; no shape-specialised kernels).
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=.peers/src
OUT=.peers/lib/libmxdg.so
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
check=0 extra=()
for arg in "$@"; do
    case $arg in
        --check) check=1 ;;
        --generic-only) extra+=(-DMXDG_GENERIC_ONLY) ;;
        *) echo "build_deepgemm.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done
verify() {
    local missing=0 syms
    command -v nm >/dev/null || { echo "build_deepgemm.sh: nm not found: entry points unchecked"; return 0; }
    syms=$(nm -D "$OUT")  # not piped into grep -q: under pipefail its early exit fails the pipe
    for sym in mxdg_m_grouped_fp8_gemm_nt_contiguous mxdg_k_grouped_fp8_gemm_nt_contiguous mxdg_config \
               mxdg_k_grouped_config mxdg_last_error; do
        grep -q " T $sym$" <<<"$syms" || { echo "build_deepgemm.sh: $OUT lacks $sym" >&2; missing=1; }
    done
    return $missing
}
if [[ $check == 1 && -f $OUT ]]; then
    verify && echo "build_deepgemm.sh: $OUT present ($(du -h "$OUT" | cut -f1)), entry points found" && exit 0
fi
for dir in "$SRC/DeepGEMM/deep_gemm/include" "$SRC/cutlass/include"; do
    [[ -d $dir ]] || { echo "build_deepgemm.sh: $dir missing (see this script's header)" >&2; exit 1; }
done
mkdir -p .peers/lib
# The flags of DeepGEMM's own JIT (csrc/jit/compiler.hpp), for a shared library instead of a cubin.
"$NVCC" -std=c++20 -O3 --expt-relaxed-constexpr --expt-extended-lambda \
    --diag-suppress=39,161,174,177,186,940 --ptxas-options=--register-usage-level=10 \
    --ptxas-options=--verbose,--warn-on-local-memory-usage \
    -gencode arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC,-O3,-Wno-deprecated-declarations \
    -I"$SRC/DeepGEMM/deep_gemm/include" -I"$SRC/cutlass/include" "${extra[@]}" \
    scripts/peers/deepgemm_launcher.cu -o "$OUT.tmp" 2> .peers/lib/ptxas.log || { cat .peers/lib/ptxas.log >&2; exit 1; }
# Spills: DeepGEMM's JIT rejects them only under DG_JIT_PTXAS_CHECK (opt-in), and its k-grouped 1D1D kernel spills
# a little at our wgrad configuration (DeepGEMM would run it so); the m-grouped 1D2D kernels must not.
spills=$(grep -B1 -E "(^|[^0-9])[1-9][0-9]* bytes spill" .peers/lib/ptxas.log | grep -o "sm90_fp8_gemm_1d[12]d_impl" || true)
if grep -q 1d2d <<<"$spills"; then
    echo "build_deepgemm.sh: an m-grouped (1D2D) kernel spills (see .peers/lib/ptxas.log)" >&2; exit 1
fi
[[ -z $spills ]] || echo "build_deepgemm.sh: note: the k-grouped (1D1D, wgrad) kernels spill $(grep -oE "(^|[^0-9])[1-9][0-9]* bytes spill stores" .peers/lib/ptxas.log | sed "s/^[^0-9]*//" | sort -u | paste -sd, -) (as DeepGEMM's own build would)"
mv "$OUT.tmp" "$OUT"
verify
echo "build_deepgemm.sh: built $OUT ($(du -h "$OUT" | cut -f1)) with $("$NVCC" --version | tail -1)"
