"""Which configuration DeepGEMM's own heuristic picks for its SM90 FP8 m-grouped contiguous GEMM (1D2D kernel, bf16
out), ported from csrc/jit_kernels/heuristics/sm90.hpp and common.hpp (DeepGEMM 54e2261): our launcher compiles a
fixed configuration, and this says -- and tests/test_peer_deepgemm.py checks -- that it is the one DeepGEMM would
run at our shapes, so the peer is timed as its authors tune it, not as we guess.

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


def _pipeline(block_m: int, block_n: int, k: int) -> tuple[int, int]:
    """(stages, dynamic smem bytes): get_pipeline_config for fp8 A/B, bf16 D, the 1D2D kernel."""
    smem_d = _align(block_m * block_n * 2, 1024)
    barriers = MAX_STAGES * 8 * 2
    extra_sfb = _align(_cdiv(k, BLOCK_K) * 4 * (1 if BLOCK_K % block_n == 0 else 2), 8)
    extra = smem_d + barriers + extra_sfb
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + _align(block_m * 4, 128)
    stages = min((SMEM_CAPACITY - extra) // per_stage, MAX_STAGES)
    return stages, extra + stages * per_stage


def _cycles(c: Choice, m: int, n: int, k: int, num_sms: int) -> float:
    """get_layout_info's model: L1/L2 traffic cycles over the wave efficiency; multicast only with several waves."""
    blocks = _cdiv(m, c.block_m) * _cdiv(n, c.block_n)  # expected_num_groups = 1 without a psum layout
    waves = _cdiv(blocks, num_sms)
    l2_per_cycle = int(min(64.0 * num_sms, 8e6 / 1.3e3))
    l1_per_cycle = 128 * num_sms
    l2_ab = k * (c.block_m // c.cluster_n + c.block_n // c.cluster_m)
    l1_ab = k * (c.block_m + c.block_n)
    l1_tc = k * (max(64, c.block_m) + c.block_n) + c.block_m * c.block_n * 2
    cd = c.block_m * c.block_n * 2
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


# (M, N, K) of each launch scripts/tune_fp8_gemm.py times: fwd (N, K) and dgrad (K, N) of each model.
TIMED = {
    "deepseek-v3 fwd": (131072, 2048, 7168),
    "deepseek-v3 dgrad": (131072, 7168, 2048),
    "llama4-scout fwd": (131072, 8192, 5120),
    "llama4-scout dgrad": (131072, 5120, 8192),
}

if __name__ == "__main__":
    for name, shape in TIMED.items():
        print(f"{name:20s} M, N, K = {shape}: {best(*shape)}")
