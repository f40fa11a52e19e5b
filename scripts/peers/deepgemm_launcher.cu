// Our host launcher for DeepGEMM's SM90 FP8 grouped GEMM (the m-grouped "contiguous" layout, 1D2D kernel:
// 1x128 activation scales, 128x128 weight scales), so the GEMM can be timed beside ours without DeepGEMM's JIT,
// torch extension or Python package -- none of which the device has. The kernel template is DeepGEMM's own
// (deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh, sources under .peers/src, see scripts/peers/build_deepgemm.sh);
// this file only does what DeepGEMM's host side does for it (csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp,
// runtime_utils.hpp, jit/handle.hpp): pick the configuration, build the TMA descriptors, launch.
//
// The wgrad GEMM is DeepGEMM's k-grouped one (deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh, host side
// sm90_k_grouped_fp8_gemm_1d1d), a different kernel and recipe: see mxdg_k_grouped_fp8_gemm_nt_contiguous below.
//
// m-grouped contract (all device pointers, row-major, no host sync, graph-capturable):
//   a   (M, K) e4m3, K contiguous;      sfa: float, MN-major: element (m, kb) at sfa[kb * align(M, 4) + m]
//   b   (G, N, K) e4m3, K contiguous;   sfb: float (G, ceil(N/128), ceil(K/128)) contiguous (K-major)
//   d   (M, N) bf16;                    m_indices: int32 (M,), each row's group, -1 for padding rows
// Each group's rows start on a multiple of 128 (BLOCK_M). The kernel skips a 64-row half of a block only when its first
// row is -1 (writing zeros); it computes the other padding rows like their group's, so their output is zero only
// where A's padding rows are (as a token permutation's zero fill leaves them).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include <deep_gemm/impls/sm90_fp8_gemm_1d1d.cuh>
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>

namespace {

using deep_gemm::GemmType;

// The configuration DeepGEMM's heuristic (csrc/jit_kernels/heuristics/sm90.hpp, get_best_config) picks on a
// 132-SM H100 for every one of our four shapes (M = 131072; N, K in {2048, 7168}, {7168, 2048}, {8192, 5120},
// {5120, 8192}): BLOCK_M 128 (the contiguous layout's alignment), BLOCK_N 192, 2-CTA clusters multicasting B
// (cluster_m = 2), 4 stages, 128-byte swizzles, 128 TMA + 256 math threads. scripts/peers/deepgemm_config.py
// ports the heuristic so this claim is checked, not trusted.
constexpr uint32_t kBlockM = 128, kBlockN = 192, kBlockK = 128;
constexpr uint32_t kStages = 4, kTmaThreads = 128, kMathThreads = 256;
constexpr uint32_t kCluster = 2;
constexpr bool kMulticastOnA = false;  // cluster_n == 1: the two CTAs of a cluster share B's tile
constexpr uint32_t kSwizzleAB = 128, kSwizzleD = 128;
// kNumSMs is a template constant of the persistent scheduler (its stride); the H100 SXM and H200 both have 132.
constexpr uint32_t kNumSMs = 132;
constexpr int kSmemCapacity = 232448;

template <uint32_t N, uint32_t K, uint32_t G>
constexpr auto kernel_of() {
    // "nk" compiled, as DeepGEMM's m_grouped_fp8_gemm_nt_contiguous does by default (compiled_dims = "nk");
    // N = K = 0 is the generic instance (sizes at run time), used for the tests' small shapes.
    return &deep_gemm::sm90_fp8_gemm_1d2d_impl<
        cute::UMMA::Major::K, 0, N, K, G, kBlockM, kBlockN, kBlockK, kSwizzleAB, kSwizzleAB, kSwizzleD, kStages,
        kTmaThreads, kMathThreads, kCluster, kMulticastOnA, kNumSMs, GemmType::MGroupedContiguous,
        cutlass::bfloat16_t, deep_gemm::epilogue::transform::EpilogueIdentity>;
}

using KernelFn = void (*)(float*, int*, uint32_t, uint32_t, uint32_t, const cute::TmaDescriptor,
                          const cute::TmaDescriptor, const cute::TmaDescriptor, const cute::TmaDescriptor);

struct Instance {
    int n, k, g;  // 0 = at run time
    KernelFn fn;
};

// The shapes of scripts/tune_fp8_gemm.py (fwd: N, K; dgrad: K, N of each model), G = 8, and the generic one.
// MXDG_GENERIC_ONLY builds the generic one alone (a quick compile check).
const Instance kInstances[] = {
#ifndef MXDG_GENERIC_ONLY
    {2048, 7168, 8, kernel_of<2048, 7168, 8>()},  // DeepSeek-V3 fwd
    {7168, 2048, 8, kernel_of<7168, 2048, 8>()},  // DeepSeek-V3 dgrad
    {8192, 5120, 8, kernel_of<8192, 5120, 8>()},  // Llama 4 Scout fwd
    {5120, 8192, 8, kernel_of<5120, 8192, 8>()},  // Llama 4 Scout dgrad
#endif
    {0, 0, 0, kernel_of<0, 0, 0>()},              // any other (N, K, G)
};

// The k-grouped (wgrad) kernel: DeepGEMM's heuristic picks, at both models' wgrad shapes (M, N = 2048, 7168 and
// 8192, 5120; 8 groups of 16384 tokens), BLOCK_M 128, BLOCK_N 152, 4 stages, no multicast (none above 4 groups);
// 64-row stores of fp32 D, 128 + 256 threads (scripts/peers/deepgemm_config.py: best_k_grouped).
constexpr uint32_t kKgBlockM = 128, kKgBlockN = 152, kKgStages = 4, kKgStoreBlockM = 64;

template <uint32_t M, uint32_t N, uint32_t G>
constexpr auto k_grouped_kernel_of() {
    // "mn" compiled, as k_grouped_fp8_gemm_nt_contiguous does by default; K (the groups' sum) at run time. The group
    // count is a template constant of the k-grouped scheduler, so the generic instance has G = 8 too.
    return &deep_gemm::sm90_fp8_gemm_1d1d_impl<
        M, N, 0, G, kKgBlockM, kKgBlockN, kBlockK, kSwizzleAB, kSwizzleAB, kKgStages, kTmaThreads, kMathThreads,
        1, false, kNumSMs, GemmType::KGroupedContiguous, float>;
}

using KgKernelFn = void (*)(__nv_fp8_e4m3*, __nv_fp8_e4m3*, int*, cute::TmaDescriptor*, uint32_t, uint32_t, uint32_t,
                            const cute::TmaDescriptor, const cute::TmaDescriptor, const cute::TmaDescriptor,
                            const cute::TmaDescriptor, const cute::TmaDescriptor);

struct KgInstance {
    int m, n, g;  // m = n = 0: at run time
    KgKernelFn fn;
};

const KgInstance kKgInstances[] = {
#ifndef MXDG_GENERIC_ONLY
    {2048, 7168, 8, k_grouped_kernel_of<2048, 7168, 8>()},  // DeepSeek-V3 wgrad: (N, K) per group
    {8192, 5120, 8, k_grouped_kernel_of<8192, 5120, 8>()},  // Llama 4 Scout wgrad
#endif
    {0, 0, 8, k_grouped_kernel_of<0, 0, 8>()},
};

thread_local char g_error[512] = "";

int fail(const char* what, int code) {
    std::snprintf(g_error, sizeof(g_error), "%s", what);
    return code;
}

uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
uint32_t align_up(uint32_t a, uint32_t b) { return ceil_div(a, b) * b; }

// cuTensorMapEncodeTiled through the runtime's driver entry point, so the library needs no -lcuda at link time
// (torch's process has the driver loaded already).
using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeFn encode_fn() {
    static EncodeFn fn = [] {
        void* ptr = nullptr;
        cudaDriverEntryPointQueryResult status;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status)
                != cudaSuccess or status != cudaDriverEntryPointSuccess)
            return static_cast<EncodeFn>(nullptr);
        return reinterpret_cast<EncodeFn>(ptr);
    }();
    return fn;
}

CUtensorMapSwizzle swizzle_of(uint32_t bytes) {
    switch (bytes) {
        case 32: return CU_TENSOR_MAP_SWIZZLE_32B;
        case 64: return CU_TENSOR_MAP_SWIZZLE_64B;
        case 128: return CU_TENSOR_MAP_SWIZZLE_128B;
        default: return CU_TENSOR_MAP_SWIZZLE_NONE;
    }
}

// DeepGEMM's make_tma_2d_desc: a 2D box over (inner, outer) with the outer stride in elements; under a swizzle the
// box's inner extent is one swizzle atom (the kernel issues BLOCK_INNER / atom copies).
bool make_2d(CUtensorMap* map, CUtensorMapDataType dtype, uint32_t elem_size, const void* ptr, uint64_t inner,
             uint64_t outer, uint32_t box_inner, uint32_t box_outer, uint64_t outer_stride, uint32_t swizzle) {
    if (swizzle != 0)
        box_inner = swizzle / elem_size;
    const cuuint64_t dims[2] = {inner, outer};
    const cuuint64_t strides[1] = {outer_stride * elem_size};
    const cuuint32_t box[2] = {box_inner, box_outer};
    const cuuint32_t elem_strides[2] = {1, 1};
    auto encode = encode_fn();
    return encode != nullptr and
           encode(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_of(swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// DeepGEMM's get_pipeline_config for this configuration: the output tile, the barriers (16 stages' worth, as it
// reserves), B's scales for one tile (two rows when BLOCK_N does not divide 128) and the stages.
int smem_bytes(uint32_t k) {
    const uint32_t smem_d = align_up(kBlockM * kBlockN * 2, 1024);
    const uint32_t barriers = 16 * 8 * 2;
    const uint32_t sfb = align_up(ceil_div(k, kBlockK) * 4 * (kBlockK % kBlockN == 0 ? 1 : 2), 8);
    const uint32_t per_stage = kBlockM * kBlockK + kBlockN * kBlockK + align_up(kBlockM * 4, 128);
    return static_cast<int>(smem_d + barriers + sfb + kStages * per_stage);
}

// get_pipeline_config for the k-grouped kernel: fp32 D tile, barriers, 4 tensor maps' room, and per stage A, B and
// both operands' scales (B's per row of N here: both are 1x128).
int kg_smem_bytes() {
    const uint32_t smem_d = align_up(kKgBlockM * kKgBlockN * 4, 1024);
    const uint32_t per_stage = kKgBlockM * kBlockK + kKgBlockN * kBlockK + align_up(kKgBlockM * 4, 128) +
                               align_up(kKgBlockN * 4, 128);
    return static_cast<int>(smem_d + 16 * 8 * 2 + 4 * 128 + kKgStages * per_stage);
}

// cudaFuncSetAttribute once per kernel and size: later calls may come inside a CUDA graph capture, where only the
// launch should happen (torch.cuda.graph's capture mode refuses some runtime calls from any thread).
bool ensure_smem(const void* kernel, int smem) {
    static std::mutex lock;
    static std::vector<std::pair<const void*, int>> done;
    std::lock_guard<std::mutex> guard(lock);
    for (const auto& [k, size]: done)
        if (k == kernel and size >= smem)
            return true;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return false;
    done.emplace_back(kernel, smem);
    return true;
}

cudaLaunchConfig_t launch_config(int smem, void* stream, cudaLaunchAttribute* attrs, uint32_t cluster) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kNumSMs, 1, 1);
    config.blockDim = dim3(kTmaThreads + kMathThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = static_cast<cudaStream_t>(stream);
    config.attrs = attrs;
    config.numAttrs = 0;  // no programmatic dependent launch: each timed call stands alone
    if (cluster > 1) {
        attrs[0].id = cudaLaunchAttributeClusterDimension;
        attrs[0].val.clusterDim.x = cluster;
        attrs[0].val.clusterDim.y = 1;
        attrs[0].val.clusterDim.z = 1;
        config.numAttrs = 1;
    }
    return config;
}

}  // namespace

extern "C" {

// The last error of this thread's calls, for the Python side's exception.
const char* mxdg_last_error() { return g_error; }

// The configuration the launcher runs, so the results can say which: block M, N, K, stages, cluster size,
// multicast operand (0: B, 1: A), SM count it was compiled for, whether (n, k, g) has a compiled instance, and
// the dynamic shared memory of a launch; returns how many values there are.
int mxdg_config(int n, int k, int g, int* out, int out_len) {
    int compiled = 0;
    for (const auto& inst: kInstances)
        compiled |= (inst.n == n and inst.k == k and inst.g == g);
    const int values[] = {int(kBlockM), int(kBlockN), int(kBlockK), int(kStages), int(kCluster),
                          int(kMulticastOnA), int(kNumSMs), compiled, smem_bytes(static_cast<uint32_t>(k))};
    const int count = static_cast<int>(sizeof(values) / sizeof(values[0]));
    for (int i = 0; i < out_len and i < count; ++i)
        out[i] = values[i];
    return count;
}

// d = per-group (a * sfa) @ (b[g] * sfb[g])^T for the m-grouped contiguous layout; 0 on success, else an error
// code with mxdg_last_error() saying why. `stream` is a cudaStream_t (torch's current stream).
int mxdg_m_grouped_fp8_gemm_nt_contiguous(const void* a, const float* sfa, const void* b, const float* sfb,
                                         void* d, const int* m_indices, int m, int n, int k, int g,
                                         void* stream) {
    if (m <= 0 or n <= 0 or k <= 0 or g <= 0)
        return fail("m, n, k and g must be positive", 1);
    if (m % kBlockM != 0)
        return fail("m must be a multiple of 128 (the contiguous layout's alignment)", 1);
    if (k % kBlockK != 0 or n % 16 != 0)
        return fail("k must be a multiple of 128 and n of 16 (TMA strides, the kernel's 8-column steps)", 1);
    KernelFn fn = nullptr;
    for (const auto& inst: kInstances)
        if ((inst.n == n and inst.k == k and inst.g == g) or (inst.n == 0 and fn == nullptr))
            fn = inst.fn;
    const int smem = smem_bytes(static_cast<uint32_t>(k));
    if (smem > kSmemCapacity)
        return fail("k too large for the shared memory of this configuration", 1);

    CUtensorMap map_a, map_b, map_d, map_sfa;
    const uint64_t mk = static_cast<uint64_t>(m), nk = static_cast<uint64_t>(n), kk = static_cast<uint64_t>(k);
    const uint64_t m_aligned = align_up(static_cast<uint32_t>(m), 4);  // 16 bytes of float
    bool ok = make_2d(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a, kk, mk, kBlockK, kBlockM, kk, kSwizzleAB) and
              make_2d(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, b, kk, nk * g, kBlockK, kBlockN, kk, kSwizzleAB) and
              make_2d(&map_d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, d, nk, mk, kBlockN, kBlockM, nk, kSwizzleD) and
              make_2d(&map_sfa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, sfa, m_aligned, kk / kBlockK, kBlockM, 1,
                      m_aligned, 0);
    if (not ok)
        return fail("cuTensorMapEncodeTiled failed (alignment of a pointer or stride?)", 2);

    if (not ensure_smem(reinterpret_cast<const void*>(fn), smem))
        return fail(cudaGetErrorString(cudaGetLastError()), 3);

    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t config = launch_config(smem, stream, attrs, kCluster);

    float* sfb_arg = const_cast<float*>(sfb);
    int* layout_arg = const_cast<int*>(m_indices);
    uint32_t um = static_cast<uint32_t>(m), un = static_cast<uint32_t>(n), uk = static_cast<uint32_t>(k);
    const cudaError_t err = cudaLaunchKernelEx(&config, fn, sfb_arg, layout_arg, um, un, uk,
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_a),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_b),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_d),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_sfa));
    if (err != cudaSuccess)
        return fail(cudaGetErrorString(err), 4);
    return 0;
}

// The k-grouped GEMM of wgrad, DeepGEMM's k_grouped_fp8_gemm_nt_contiguous on SM90: for each group g with ks[g] > 0
// (a multiple of 128), d[g] (m, n) fp32 += (a_g * sfa_g) @ (b_g * sfb_g)^T, where a_g (m, ks[g]) and b_g (n, ks[g])
// e4m3 are K-contiguous and stored one group after another (a_g at a + m * sum(ks[:g])); both operands' scales are
// 1x128 along K, float, MN-major: sfa (sum_g ks[g] / 128, align(m, 4)), sfb (same rows, align(n, 4)). d accumulates
// (TMA reduce-add), so zero it first for a plain product; an empty group's d[g] is left as it is. `ks` is on the
// host (the descriptors need the first group's K and the scales' extent), `ks_device` the same G values on the device;
// `tensormap_buffer` is device memory for 2 * 132 descriptors of 128 bytes (the kernel rewrites A's and B's per
// group). Returns 0 on success, else an error code with mxdg_last_error().
int mxdg_k_grouped_fp8_gemm_nt_contiguous(const void* a, const float* sfa, const void* b, const float* sfb,
                                         float* d, const int* ks, const int* ks_device, void* tensormap_buffer,
                                         int m, int n, int g, void* stream) {
    if (m <= 0 or n <= 0 or g <= 0)
        return fail("m, n and g must be positive", 1);
    if (m % kKgBlockM != 0 or n % 4 != 0)
        return fail("m must be a multiple of 128 (a block past m would read and add into the next group's rows) "
                    "and n of 4 (TMA strides of the scales and of fp32 D)", 1);
    uint64_t sum_k = 0;
    uint32_t first_k = 0, sum_sf_k = 0;
    for (int i = 0; i < g; ++i) {
        if (ks[i] < 0 or ks[i] % 128 != 0)
            return fail("every group's K must be a non-negative multiple of 128", 1);
        if (first_k == 0)
            first_k = static_cast<uint32_t>(ks[i]);
        sum_k += static_cast<uint64_t>(ks[i]);
        sum_sf_k += static_cast<uint32_t>(ks[i]) / kBlockK;
    }
    if (sum_k == 0)
        return 0;  // nothing to add
    KgKernelFn fn = nullptr;
    for (const auto& inst: kKgInstances)
        if (inst.g == g and ((inst.m == m and inst.n == n) or (inst.m == 0 and fn == nullptr)))
            fn = inst.fn;
    if (fn == nullptr)
        return fail("no instance for this group count (compiled for 8)", 1);

    CUtensorMap map_a, map_b, map_sfa, map_sfb, map_d;
    const uint64_t m_aligned = align_up(static_cast<uint32_t>(m), 4), n_aligned = align_up(static_cast<uint32_t>(n), 4);
    bool ok = make_2d(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a, first_k, m, kBlockK, kKgBlockM, first_k, kSwizzleAB) and
              make_2d(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, b, first_k, n, kBlockK, kKgBlockN, first_k, kSwizzleAB) and
              make_2d(&map_sfa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, sfa, m_aligned, sum_sf_k, kKgBlockM, 1, m_aligned, 0) and
              make_2d(&map_sfb, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, sfb, n_aligned, sum_sf_k, kKgBlockN, 1, n_aligned, 0) and
              make_2d(&map_d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, d, n, static_cast<uint64_t>(m) * g, kKgBlockN,
                      kKgStoreBlockM, n, 0);
    if (not ok)
        return fail("cuTensorMapEncodeTiled failed (alignment of a pointer or stride?)", 2);

    const int smem = kg_smem_bytes();
    if (not ensure_smem(reinterpret_cast<const void*>(fn), smem))
        return fail(cudaGetErrorString(cudaGetLastError()), 3);
    cudaLaunchAttribute attrs[1];
    const cudaLaunchConfig_t config = launch_config(smem, stream, attrs, 1);
    auto a_arg = static_cast<__nv_fp8_e4m3*>(const_cast<void*>(a));
    auto b_arg = static_cast<__nv_fp8_e4m3*>(const_cast<void*>(b));
    auto layout_arg = const_cast<int*>(ks_device);
    auto buffer_arg = static_cast<cute::TmaDescriptor*>(tensormap_buffer);
    uint32_t um = static_cast<uint32_t>(m), un = static_cast<uint32_t>(n), uk = static_cast<uint32_t>(sum_k);
    const cudaError_t err = cudaLaunchKernelEx(&config, fn, a_arg, b_arg, layout_arg, buffer_arg, um, un, uk,
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_a),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_b),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_sfa),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_sfb),
                                               *reinterpret_cast<cute::TmaDescriptor*>(&map_d));
    if (err != cudaSuccess)
        return fail(cudaGetErrorString(err), 4);
    return 0;
}

// The k-grouped configuration for (m, n, g): block M, N, K, stages, cluster, SM count, compiled instance, smem.
int mxdg_k_grouped_config(int m, int n, int g, int* out, int out_len) {
    int compiled = 0;
    for (const auto& inst: kKgInstances)
        compiled |= (inst.m == m and inst.n == n and inst.g == g);
    const int values[] = {int(kKgBlockM), int(kKgBlockN), int(kBlockK), int(kKgStages), 1, 0, int(kNumSMs),
                          compiled, kg_smem_bytes()};
    const int count = static_cast<int>(sizeof(values) / sizeof(values[0]));
    for (int i = 0; i < out_len and i < count; ++i)
        out[i] = values[i];
    return count;
}

}  // extern "C"
