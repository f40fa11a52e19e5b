"""The grouped GEMMs' oracle and operands, shared by the test_gemm_*.py files (pytest puts kernels/tests/ on sys.path:
``from gemm_oracle import ...``).

The oracle is built here, independently of the code under test: operands quantized with
``format.quantize_reference``, per-group blocked scales composed from ``layouts.to_blocked`` following the layouts
of docs/architecture.md, and an fp32 reference computed group by group from ``dequantize_reference``. On CPU the
Triton backends run under the interpreter on small shapes (the interpreter's ``tl.dot_scaled`` and fp8 ``tl.dot``
compute in fp32); the ``gpu`` tests run them at DeepSeek-V3 sizes on operands from ``gpu_case``.
"""

import itertools

import torch
from kernel_helpers import offsets
from mxkernels.core.cost import ceil_to
from mxkernels.core.format import dequantize_reference, quantize_reference
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import GemmCase
from mxkernels.layouts.scale_layout import blocked_3d_shape, m_groups_shape, to_blocked

CASES = list(GemmCase)  # test ids "2d3d", "2d2d": a member is its string
TRITON_BACKENDS = ["triton", "triton_fp8"]


def bounds(sizes):
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends))


def m_groups_blocked(scales, sizes):
    """Group g's blocked image starts at row sum_{j<g} ceil128(size_j) of a (128 * (ceil(M/128) + G), ceil4(C))
    zero buffer."""
    M, C = scales.shape
    out = torch.zeros(128 * (-(-M // 128) + len(sizes)), ceil_to(C, 4), dtype=torch.uint8, device=scales.device)
    row = 0
    for start, end in bounds(sizes):
        image = to_blocked(scales[start:end]).view(torch.uint8)
        out[row : row + image.shape[0]] = image
        row += image.shape[0]
    return out


def k_groups_blocked(scales, sizes):
    """Complete blocked images (ceil128(R) x ceil4(size_g / 32)) back to back from byte 0 of a
    (ceil128(R), M/32 + 4G) zero buffer."""
    R, cols = scales.shape
    out = torch.zeros(ceil_to(R, 128), cols + 4 * len(sizes), dtype=torch.uint8, device=scales.device)
    flat, pos = out.view(-1), 0
    for start, end in bounds(sizes):
        image = to_blocked(scales[:, start // 32 : end // 32]).view(torch.uint8).reshape(-1)
        flat[pos : pos + image.numel()] = image
        pos += image.numel()
    return out


def mx_2d3d(a, w, sizes):
    """Operands of out = a @ w_g^T: a (M, K), w (G, N, K) -> (kwargs of mxfp8_scaled_grouped_mm, fp32 reference)."""
    a_q, a_s = quantize_reference(a)
    w_q, w_s = quantize_reference(w)
    ref = torch.zeros(a.shape[0], w.shape[1], device=a.device)
    for g, (s, e) in enumerate(bounds(sizes)):
        ref[s:e] = dequantize_reference(a_q[s:e], a_s[s:e]) @ dequantize_reference(w_q[g], w_s[g]).T
    ops = {
        "a_q": a_q,
        "a_sb": m_groups_blocked(a_s, sizes),
        "b_q": w_q,
        "b_sb": torch.stack([to_blocked(s) for s in w_s]),
    }
    return ops, ref


def mx_2d2d(x, y, sizes):
    """Operands of out[g] = x[:, g] @ y[:, g]^T: x (N, M), y (K, M) -> (kwargs, fp32 reference (G, N, K))."""
    x_q, x_s = quantize_reference(x)
    y_q, y_s = quantize_reference(y)
    ref = torch.zeros(len(sizes), x.shape[0], y.shape[0], device=x.device)
    for g, (s, e) in enumerate(bounds(sizes)):
        cols = slice(s // 32, e // 32)
        ref[g] = dequantize_reference(x_q[:, s:e], x_s[:, cols]) @ dequantize_reference(y_q[:, s:e], y_s[:, cols]).T
    ops = {"a_q": x_q, "a_sb": k_groups_blocked(x_s, sizes), "b_q": y_q, "b_sb": k_groups_blocked(y_s, sizes)}
    return ops, ref


def sqnr(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


def hp_reference(a, b, sizes):
    """fp32 torch._grouped_mm of the unquantized operands."""
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], device=a.device)
        for g, (s, e) in enumerate(bounds(sizes)):
            out[s:e] = a[s:e].float() @ b[g].float()
        return out
    return torch.stack([a[:, s:e].float() @ b[s:e].float() for s, e in bounds(sizes)])


# 2D x 3D: K = 160 is one whole 128-wide scale word and one 32-wide chunk more. 2D x 2D: group sizes of one word
# and one to three chunks, a chunk alone, and an empty group.
CPU_SIZES = {"2d3d": [40, 0, 100, 37], "2d2d": [160, 0, 96, 32]}


def small_case(case, device, gen):
    sizes = CPU_SIZES[case]
    if case == "2d3d":
        a = torch.randn(sum(sizes) + 23, 160, generator=gen).to(device)  # 23 rows past offs[-1]
        return mx_2d3d(a, torch.randn(4, 48, 160, generator=gen).to(device), sizes), sizes
    M = sum(sizes)
    return mx_2d2d(
        torch.randn(40, M, generator=gen).to(device), torch.randn(72, M, generator=gen).to(device), sizes
    ), sizes


def valid(out, sizes, case):
    return out[: sum(sizes)] if case == "2d3d" else out


def run_mx(ops, sizes, device, backend, **kwargs):
    """``mxfp8_scaled_grouped_mm`` of the operands ``ops`` over groups of ``sizes`` on ``backend``."""
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend=backend, **kwargs)


def mx_operands(device, K=64, N=32, G=2, M=64):
    """Zero MXFP8 operands of a 2D x 3D GEMM, every shape valid: what the refusal tests change one thing of."""
    e4m3 = torch.float8_e4m3fn
    return {
        "a_q": torch.zeros(M, K, dtype=e4m3, device=device),
        "a_sb": torch.zeros(m_groups_shape(M, K // 32, G), dtype=torch.uint8, device=device),
        "b_q": torch.zeros(G, N, K, dtype=e4m3, device=device),
        "b_sb": torch.zeros(blocked_3d_shape(G, N, K // 32), dtype=torch.uint8, device=device),
        "offs": offsets([M // 2, M // 2], device),
    }


def front_door_inputs(case, device):
    """bf16 operands of ``grouped_mm`` (a, b, group sizes), an empty group and rows past the last group included."""
    gen = torch.Generator().manual_seed(3)
    sizes = [64, 0, 96]
    M = sum(sizes)
    a = torch.randn(M + 32, 128, generator=gen).to(device, torch.bfloat16)
    if case == "2d3d":
        w = torch.randn(3, 64, 128, generator=gen).to(device, torch.bfloat16)
        return a, w.transpose(-2, -1), sizes  # b (G, K, N): a transposed view of the weights, as a model holds it
    grad_out = torch.randn(M, 64, generator=gen).to(device, torch.bfloat16)
    return grad_out.t(), a[:M], sizes  # (N, M) as a transposed view, (M, K)


def gpu_sizes(M, G, multiple):
    """G group sizes summing to M, multiples of ``multiple``, uneven, group 1 empty."""
    weights = torch.tensor([3.0, 0.0, 1.0, 5.0, 0.5, 2.0, 1.5, 4.0][:G])
    sizes = (weights / weights.sum() * M / multiple).floor().long() * multiple
    sizes[-1] += M - sizes.sum()
    return sizes.tolist()


def gpu_case(case, M, K, N, G, sizes, seed=0):
    """MX operands and fp32 reference of a 2D x 3D (a (M, K), w (G, N, K)) or 2D x 2D (x (N, M), y (K, M)) GEMM."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if case == "2d3d":
        a = torch.randn(M, K, device="cuda", generator=gen)
        return mx_2d3d(a, torch.randn(G, N, K, device="cuda", generator=gen) * K**-0.5, sizes)
    x = torch.randn(N, M, device="cuda", generator=gen) * 1e-2
    return mx_2d2d(x, torch.randn(K, M, device="cuda", generator=gen), sizes)


GPU_SHAPES = [  # (M, K, N, G): moderate, then DeepSeek-V3 (K = 7168, N = 2048, G = 8)
    (4096, 1024, 512, 4),
    (16384, 7168, 2048, 8),
    (131072, 7168, 2048, 8),
]


def gpu_bf16_case(case, M, K, N, G, seed, grad_view=True):
    """bf16 operands of grouped_mm on the GPU: 2D x 3D a (M, K) and b (G, K, N), a transposed view of the weights;
    2D x 2D a (N, M), the transposed view of an (M, N) gradient (or, ``grad_view=False``, contiguous), and b (M, K)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if case == "2d3d":
        a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        return a, (torch.randn(G, N, K, device="cuda", generator=gen) * K**-0.5).bfloat16().transpose(-2, -1)
    if grad_view:
        a = (torch.randn(M, N, device="cuda", generator=gen) * 1e-2).bfloat16().t()
    else:
        a = (torch.randn(N, M, device="cuda", generator=gen) * 1e-2).bfloat16()
    return a, torch.randn(M, K, device="cuda", generator=gen).bfloat16()
