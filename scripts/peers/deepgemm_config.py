"""Which configuration DeepGEMM's own heuristic picks for its SM90 FP8 grouped GEMMs -- m-grouped contiguous (1D2D
kernel, bf16 out: fwd, dgrad) and k-grouped contiguous (1D1D kernel, fp32 out accumulated: wgrad) -- ported from
csrc/jit_kernels/heuristics/sm90.hpp and common.hpp (DeepGEMM 54e2261): our launcher compiles fixed configurations,
and this says -- and tests/test_peer_deepgemm.py checks -- that they are the ones DeepGEMM would run at our shapes,
so the peer is timed as its authors tune it, not as we guess.

    python scripts/peers/deepgemm_config.py     # the choice for each timed shape on a 132-SM H100
"""

from __future__ import annotations

from dataclasses import dataclass

SMEM_CAPACITY = 232448  # SM90ArchSpec::smem_capacity
BLOCK_K = 128  # 128 / sizeof(e4m3)
MAX_STAGES = 16


@dataclass(frozen=True)
class Choice:
    block_m: int
    block_n: int
    cluster_m: int
    cluster_n: int
    stages: int
    smem_bytes: int

    @property
    def multicast_on_a(self) -> bool:  # generate_impl passes `cluster_n > 1`
        return self.cluster_n > 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def _pipeline(block_m: int, block_n: int, k: int, k_grouped: bool = False) -> tuple[int, int]:
    """(stages, dynamic smem bytes): get_pipeline_config for fp8 A/B; the 1D2D kernel (bf16 D, B's scales for the
    whole K once) or, ``k_grouped``, the 1D1D one (fp32 D, B's scales per stage, two tensor maps in smem)."""
    smem_d = _align(block_m * block_n * (4 if k_grouped else 2), 1024)
    barriers = MAX_STAGES * 8 * 2
    extra_sfb = 0 if k_grouped else _align(_cdiv(k, BLOCK_K) * 4 * (1 if BLOCK_K % block_n == 0 else 2), 8)
    extra = smem_d + barriers + extra_sfb + (4 * 128 if k_grouped else 0)
    sfb_per_stage = _align(block_n * 4, 128) if k_grouped else 0
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + _align(block_m * 4, 128) + sfb_per_stage
    stages = min((SMEM_CAPACITY - extra) // per_stage, MAX_STAGES)
    return stages, extra + stages * per_stage


def _cycles(c: Choice, m: int, n: int, k: int, num_sms: int, groups: int = 1, cd_bytes: int = 2) -> float:
    """get_layout_info's model: L1/L2 traffic cycles over the wave efficiency; multicast only with several waves.
    ``groups``: expected_num_groups (1 for the m-grouped layout, G for k-grouped); ``cd_bytes`` 4 with fp32 out,
    whose accumulation reads C too."""
    blocks = _cdiv(m, c.block_m) * _cdiv(n, c.block_n) * groups
    waves = _cdiv(blocks, num_sms)
    l2_per_cycle = int(min(64.0 * num_sms, 8e6 / 1.3e3))
    l1_per_cycle = 128 * num_sms
    l2_ab = k * (c.block_m // c.cluster_n + c.block_n // c.cluster_m)
    l1_ab = k * (c.block_m + c.block_n)
    l1_tc = k * (max(64, c.block_m) + c.block_n) + c.block_m * c.block_n * cd_bytes
    cd = c.block_m * c.block_n * cd_bytes * (2 if cd_bytes == 4 else 1)  # with_accumulation: fp32 out only
    l2 = (l2_ab + cd) * blocks // l2_per_cycle
    l1 = (l1_ab + l1_tc + cd) * blocks // l1_per_cycle
    if c.cluster_m * c.cluster_n > 1 and waves <= 1:
        return float("inf")
    return int(max(l1, l2) / (blocks / (waves * num_sms)))


def best(m: int, n: int, k: int, num_sms: int = 132) -> Choice:
    """get_best_config: the first candidate of least modelled cycles, candidates in DeepGEMM's enumeration order."""
    best_choice, best_cycles = None, None
    for cluster_m in (1, 2):
        for cluster_n in (1, 2):
            if cluster_m * cluster_n > 2 or num_sms % (cluster_m * cluster_n):
                continue
            for block_m in (128,):  # the contiguous layout's alignment (get_mk_alignment_for_contiguous_layout)
                for block_n in range(16, 193, 16):  # 1D2D: up to 192 (register spills above)
                    if block_n > BLOCK_K and block_n % (block_n - BLOCK_K) and BLOCK_K % (block_n - BLOCK_K):
                        continue  # the 1D2D kernel's unroll needs one of these to divide the other
                    if block_m > 128 and block_n > 128:
                        continue
                    stages, smem = _pipeline(block_m, block_n, k)
                    if stages < 3 or (block_m * block_n < 128 * 192 and stages < 4):
                        continue
                    choice = Choice(block_m, block_n, cluster_m, cluster_n, stages, smem)
                    cycles = _cycles(choice, m, n, k, num_sms)
                    if best_cycles is None or cycles < best_cycles:
                        best_choice, best_cycles = choice, cycles
    assert best_choice is not None
    return best_choice


def best_k_grouped(m: int, n: int, max_k: int, groups: int, num_sms: int = 132) -> Choice:
    """get_best_config for the k-grouped 1D1D kernel (fp32 D += A B^T per group): block M 64 or 128, block N 16 and
    24..152 by 16 (1D1D fp32 out avoids bank conflicts so), no multicast above 4 groups; modelled at the largest K."""
    best_choice, best_cycles = None, None
    multicast = (1, 2) if groups <= 4 else (1,)
    for cluster_m in multicast:
        for cluster_n in multicast:
            if cluster_m * cluster_n > 2 or num_sms % (cluster_m * cluster_n):
                continue
            for block_m in (64, 128) + ((16,) if m <= 16 else ()) + ((32,) if m <= 32 else ()):
                for block_n in [16, *range(24, 161, 16)]:
                    stages, smem = _pipeline(block_m, block_n, max_k, k_grouped=True)
                    if stages < 3 or (block_m * block_n < 128 * 192 and stages < 4):
                        continue
                    choice = Choice(block_m, block_n, cluster_m, cluster_n, stages, smem)
                    cycles = _cycles(choice, m, n, max_k, num_sms, groups=groups, cd_bytes=4)
                    if best_cycles is None or cycles < best_cycles:
                        best_choice, best_cycles = choice, cycles
    assert best_choice is not None
    return best_choice


# (M, N, K) of each launch scripts/tune_fp8_gemm.py times: fwd (N, K) and dgrad (K, N) of each model.
TIMED = {
    "deepseek-v3 fwd": (131072, 2048, 7168),
    "deepseek-v3 dgrad": (131072, 7168, 2048),
    "llama4-scout fwd": (131072, 8192, 5120),
    "llama4-scout dgrad": (131072, 5120, 8192),
}

# (M, N, K per group, G) of each k-grouped launch: wgrad dW[g] (N, K) = dY_g^T X_g over the group's 16384 tokens.
TIMED_K_GROUPED = {
    "deepseek-v3 wgrad": (2048, 7168, 16384, 8),
    "llama4-scout wgrad": (8192, 5120, 16384, 8),
}

if __name__ == "__main__":
    for name, shape in TIMED.items():
        print(f"{name:20s} M, N, K = {shape}: {best(*shape)}")
    for name, shape in TIMED_K_GROUPED.items():
        print(f"{name:20s} M, N, K, G = {shape}: {best_k_grouped(*shape)}")
