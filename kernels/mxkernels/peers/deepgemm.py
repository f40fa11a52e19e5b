"""DeepGEMM's SM90 FP8 m-grouped GEMM as a timed peer: its scaling recipe in plain torch, its reference, and a call of
the kernel through our launcher (``scripts/peers/deepgemm_launcher.cu``, built into ``.peers/lib/libmxdg.so`` by
``scripts/peers/build_deepgemm.sh``).

DeepGEMM's recipe is not ours. FP8 rowwise scales each row of A once and each output column of B once; DeepGEMM
scales A per row *and per 128 of K* ("1x128") and B per 128x128 block ("128x128"), with float32 scales, and its
kernel promotes the tensor core's sums into fp32 with both scales every 128 of K. So a table showing it beside
``torch._scaled_grouped_mm`` must say so, and its accuracy is checked against this module's reference of *its* recipe,
not against ours.

Layout, DeepGEMM's "contiguous" m-grouped one: the rows of A (M, K) are sorted by group, each group's rows start on a
multiple of 128 (``ALIGN_M``), ``m_indices`` (M,) int32 names each row's group (-1: a padding row, whose output is
zero where its row of A is: the kernel skips only 64-row halves that start with -1 and computes the rest). B is
(G, N, K), K contiguous ("nt"), so the dgrad GEMM (M, N) x (G, N, K)^T -> wants the weights as (G, K, N).

The wgrad GEMM is DeepGEMM's k-grouped one, another kernel in another recipe: dW[g] (M, N) fp32 = A_g B_g^T over
the group's tokens, A_g = dY_g^T and B_g = X_g^T each stored K(tokens)-contiguous one group after another, *both*
scaled 1x128 along the tokens ("1x128/1x128", ``K_GROUPED_RECIPE``), the output accumulated into (TMA reduce-add).

This module imports without CUDA and without the library (CI's CPU suite tests the recipe and the reference);
``load()`` raises ``PeerUnavailable`` saying why when the library cannot be used.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.format import DATA_DTYPE
from ..quant.fp8_rowwise import quantize_with_amax_reference

BLOCK = 128  # both scale granularities and the contiguous layout's row alignment
ALIGN_M = BLOCK
NUM_SMS = 132  # the launcher's kNumSMs
RECIPE = "1x128/128x128 scales"  # how tables mark the peer's rows
K_GROUPED_RECIPE = "1x128/1x128 scales"  # the wgrad kernel's
LIBRARY_ENV = "MXBENCH_DEEPGEMM_LIB"  # where the library is, when not in the checkout's .peers/lib
_DEFAULT_LIBRARY = Path(__file__).resolve().parents[1] / ".peers" / "lib" / "libmxdg.so"


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (no library, no CUDA, not an SM90 card); the message says which."""


# ---------------------------------------------------------------------------------------------------------------
# The recipe and its reference (plain torch, any device)
# ---------------------------------------------------------------------------------------------------------------


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    pad = -x.shape[dim] % multiple
    if not pad:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def quantize_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) e4m3, scale (M, ceil(K / 128)) fp32): one scale per row per 128 of K, amax / 448 (our
    rowwise recipe's rounding and amax floor, applied per 128-element segment; zero padding of a ragged last segment
    does not change its amax)."""
    m, k = x.shape
    segments = _pad_to(x, 1, BLOCK).reshape(m, -1, BLOCK)
    q, scale = quantize_with_amax_reference(segments, segments.float().abs().amax(dim=-1))
    return q.reshape(m, -1)[:, :k].contiguous(), scale


def quantize_128x128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, N, K) -> (q (G, N, K) e4m3, scale (G, ceil(N / 128), ceil(K / 128)) fp32): one scale per 128x128 block.
    The blocks are square, so quantizing w.transpose(-2, -1) gives the same values and the transposed scales: the
    dgrad GEMM's (G, K, N) weights are the forward's, requantized for nothing."""
    g, n, k = w.shape
    padded = _pad_to(_pad_to(w, 1, BLOCK), 2, BLOCK)
    nb, kb = padded.shape[1] // BLOCK, padded.shape[2] // BLOCK
    blocks = padded.reshape(g, nb, BLOCK, kb, BLOCK).permute(0, 1, 3, 2, 4).reshape(g, nb, kb, BLOCK * BLOCK)
    q, scale = quantize_with_amax_reference(blocks, blocks.float().abs().amax(dim=-1))
    q = q.reshape(g, nb, kb, BLOCK, BLOCK).permute(0, 1, 3, 2, 4).reshape(g, nb * BLOCK, kb * BLOCK)
    return q[:, :n, :k].contiguous(), scale


def dequantize_1x128(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Values of ``quantize_1x128``'s output: each element times its row's scale of its 128-column segment (exact in
    fp64; fp32 rounds the product once)."""
    return q.to(dtype) * scale.to(dtype).repeat_interleave(BLOCK, dim=1)[:, : q.shape[1]]


def dequantize_128x128(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Values of ``quantize_128x128``'s output."""
    full = scale.to(dtype).repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)
    return q.to(dtype) * full[:, : q.shape[1], : q.shape[2]]


def m_indices(sizes: list[int], device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[int]]:
    """(m_indices (M,) int32, starts): the contiguous layout of groups of these sizes, each padded up to a multiple of
    128 rows (the padding rows -1); ``starts[g]`` is group g's first row."""
    ids, starts, row = [], [], 0
    for g, size in enumerate(sizes):
        padded = -(-size // ALIGN_M) * ALIGN_M
        starts.append(row)
        ids += [g] * size + [-1] * (padded - size)
        row += padded
    return torch.tensor(ids, dtype=torch.int32, device=device), starts


def reference(a_q, a_scale, b_q, b_scale, indices: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """The recipe's product in ``dtype`` (fp64 on CPU; fp32 where fp64 matmuls are too slow), bf16 out: each row of
    the dequantized A times its group's dequantized B transposed; padding rows (-1) zero, as the kernel writes."""
    a = dequantize_1x128(a_q, a_scale, dtype)
    b = dequantize_128x128(b_q, b_scale, dtype)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=dtype, device=a.device)
    for g in range(b.shape[0]):
        rows = (indices == g).nonzero().squeeze(1)
        if rows.numel():
            out[rows] = a[rows] @ b[g].t()
    return out.to(torch.bfloat16)


@dataclass(frozen=True)
class KOperands:
    """DeepGEMM's k-grouped inputs: a (sum(ks) * m,) and b (sum(ks) * n,) e4m3, group g's (m, ks[g]) and (n, ks[g])
    K-contiguous tiles one after another; sfa (sum(ks) / 128, align(m, 4)) and sfb (same rows, align(n, 4)) fp32,
    row j of a group's block scaling its 128 tokens j; ks on the host and on the device (int32)."""

    a: torch.Tensor
    sfa: torch.Tensor
    b: torch.Tensor
    sfb: torch.Tensor
    ks: tuple[int, ...]
    ks_device: torch.Tensor
    m: int
    n: int


def _k_grouped_side(x: torch.Tensor, ks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """x (tokens, mn) -> (flat e4m3 of each group's x_g^T one after another, MN-major scales (sum(ks) / 128, align))."""
    mn = x.shape[1]
    aligned = -(-mn // 4) * 4
    qs, sf, start = [], x.new_zeros(sum(ks) // BLOCK, aligned, dtype=torch.float32), 0
    for k in ks:
        q, scale = quantize_1x128(x[start : start + k].t())
        qs.append(q.reshape(-1))
        sf[start // BLOCK : (start + k) // BLOCK, :mn] = scale.t()
        start += k
    return torch.cat(qs) if qs else x.new_empty(0, dtype=DATA_DTYPE), sf


def k_grouped_operands(a: torch.Tensor, b: torch.Tensor, ks: list[int]) -> KOperands:
    """Quantize the wgrad operands a (tokens, m) (dY) and b (tokens, n) (X), tokens sorted by group with group g's
    ks[g] (a multiple of 128) rows, into DeepGEMM's k-grouped recipe and layout."""
    if any(k % BLOCK for k in ks) or sum(ks) != a.shape[0] or a.shape[0] != b.shape[0]:
        raise ValueError(f"groups {ks}: each a multiple of 128, summing to the {a.shape[0]} tokens of a and b")
    a_q, sfa = _k_grouped_side(a, ks)
    b_q, sfb = _k_grouped_side(b, ks)
    ks_device = torch.tensor(ks, dtype=torch.int32, device=a.device)
    return KOperands(a_q, sfa, b_q, sfb, tuple(ks), ks_device, a.shape[1], b.shape[1])


def k_grouped_reference(ops: KOperands, dtype=torch.float64) -> torch.Tensor:
    """(G, m, n) fp32: each group's dequantized a_g @ b_g^T in ``dtype``; an empty group's zeros (the kernel leaves
    its output as it was: zero when it starts zeroed)."""
    out = torch.zeros(len(ops.ks), ops.m, ops.n, dtype=dtype, device=ops.a.device)
    start = 0
    for g, k in enumerate(ops.ks):
        if k:
            rows = slice(start // BLOCK, (start + k) // BLOCK)
            a = dequantize_1x128(
                ops.a[ops.m * start : ops.m * (start + k)].view(ops.m, k), ops.sfa[rows, : ops.m].t(), dtype
            )
            b = dequantize_1x128(
                ops.b[ops.n * start : ops.n * (start + k)].view(ops.n, k), ops.sfb[rows, : ops.n].t(), dtype
            )
            out[g] = a @ b.t()
        start += k
    return out.float()


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operands:
    """DeepGEMM's inputs for one GEMM: a (M, K) and b (G, N, K) e4m3 with their scales, sfa already in the kernel's
    MN-major TMA-aligned layout (``sfa_mn_major``), and the rows' group indices."""

    a: torch.Tensor
    sfa: torch.Tensor
    b: torch.Tensor
    sfb: torch.Tensor
    indices: torch.Tensor


def sfa_mn_major(scale: torch.Tensor) -> torch.Tensor:
    """(M, Kb) scales -> the same values as an (M, Kb) view of a (Kb, align(M, 4)) buffer: the layout DeepGEMM's
    kernel loads by TMA (``get_mn_major_tma_aligned_tensor``: M contiguous, rows padded to 16 bytes)."""
    m, kb = scale.shape
    buffer = scale.new_zeros(kb, -(-m // 4) * 4)
    buffer[:, :m] = scale.t()
    return buffer[:, :m].t()


def operands(a: torch.Tensor, b: torch.Tensor, indices: torch.Tensor) -> Operands:
    """Quantize bf16/fp32 a (M, K) and b (G, N, K) into DeepGEMM's recipe and layout; A's padding rows (-1) are
    zeroed first, as a token permutation leaves them, so the kernel's output there is zero as the reference's."""
    a = a.masked_fill((indices == -1).unsqueeze(1), 0)
    a_q, a_scale = quantize_1x128(a)
    b_q, b_scale = quantize_128x128(b)
    return Operands(a_q, sfa_mn_major(a_scale), b_q, b_scale, indices)


class Library:
    """The loaded launcher (``load()``)."""

    def __init__(self, path: Path):
        self.path = path
        lib = ctypes.CDLL(str(path))
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.mxdg_m_grouped_fp8_gemm_nt_contiguous.argtypes = [p, p, p, p, p, p, i, i, i, i, p]
        lib.mxdg_m_grouped_fp8_gemm_nt_contiguous.restype = i
        lib.mxdg_k_grouped_fp8_gemm_nt_contiguous.argtypes = [p, p, p, p, p, p, p, p, i, i, i, p]
        lib.mxdg_k_grouped_fp8_gemm_nt_contiguous.restype = i
        for name in ("mxdg_config", "mxdg_k_grouped_config"):
            getattr(lib, name).argtypes = [i, i, i, ctypes.POINTER(ctypes.c_int), i]
            getattr(lib, name).restype = i
        lib.mxdg_last_error.restype = ctypes.c_char_p
        self._lib = lib
        self._tensormaps: dict[torch.device, torch.Tensor] = {}

    def _config(self, fn, x: int, y: int, g: int) -> dict[str, int]:
        names = ("block_m", "block_n", "block_k", "stages", "cluster", "multicast_on_a", "num_sms", "specialised",
                 "smem_bytes")  # fmt: skip
        out = (ctypes.c_int * len(names))()
        fn(x, y, g, out, len(names))
        return dict(zip(names, out, strict=True))

    def config(self, n: int, k: int, g: int) -> dict[str, int]:
        """The m-grouped launch configuration for (n, k, g): tile, stages, cluster, multicast operand, SM count
        compiled for, whether a shape-specialised instance exists, dynamic shared memory."""
        return self._config(self._lib.mxdg_config, n, k, g)

    def k_grouped_config(self, m: int, n: int, g: int) -> dict[str, int]:
        """The k-grouped (wgrad) launch configuration for output (g, m, n)."""
        return self._config(self._lib.mxdg_k_grouped_config, m, n, g)

    def k_grouped_gemm(self, ops: KOperands, out: torch.Tensor | None = None) -> torch.Tensor:
        """out (G, m, n) fp32 += each group's a_g b_g^T (zeros first where ``out`` is None), on the current stream."""
        g = len(ops.ks)
        if ops.a.dtype != DATA_DTYPE or ops.b.dtype != DATA_DTYPE or ops.a.numel() != ops.m * sum(ops.ks):
            raise ValueError("a and b: the flat e4m3 tiles of k_grouped_operands")
        for name, sf, mn in (("sfa", ops.sfa, ops.m), ("sfb", ops.sfb, ops.n)):
            if (
                sf.shape != (sum(ops.ks) // BLOCK, -(-mn // 4) * 4)
                or not sf.is_contiguous()
                or sf.dtype != torch.float32
            ):
                raise ValueError(f"{name} {tuple(sf.shape)}: need k_grouped_operands' layout")
        out = torch.zeros(g, ops.m, ops.n, device=ops.a.device) if out is None else out
        if out.shape != (g, ops.m, ops.n) or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out {tuple(out.shape)} {out.dtype}: need ({g}, {ops.m}, {ops.n}) float32, contiguous")
        device = ops.a.device
        if device not in self._tensormaps:  # the kernel's per-SM room for the descriptors it rewrites per group
            self._tensormaps[device] = torch.empty(NUM_SMS * 4 * 128, dtype=torch.uint8, device=device)
        ks = (ctypes.c_int * g)(*ops.ks)
        status = self._lib.mxdg_k_grouped_fp8_gemm_nt_contiguous(
            ops.a.data_ptr(), ops.sfa.data_ptr(), ops.b.data_ptr(), ops.sfb.data_ptr(), out.data_ptr(),
            ctypes.cast(ks, ctypes.c_void_p), ops.ks_device.data_ptr(), self._tensormaps[device].data_ptr(),
            ops.m, ops.n, g, torch.cuda.current_stream(device).cuda_stream)  # fmt: skip
        if status:
            raise RuntimeError(f"DeepGEMM launcher: {self._lib.mxdg_last_error().decode()} (code {status})")
        return out

    def gemm(self, ops: Operands, out: torch.Tensor | None = None) -> torch.Tensor:
        """d (M, N) bf16 = the grouped GEMM of ``ops`` on the current stream (no host sync: graph-capturable)."""
        (m, k), (g, n, k_) = ops.a.shape, ops.b.shape
        _check_operands(ops, m, n, k, k_, g)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=ops.a.device) if out is None else out
        stream = torch.cuda.current_stream(ops.a.device).cuda_stream
        status = self._lib.mxdg_m_grouped_fp8_gemm_nt_contiguous(
            ops.a.data_ptr(), ops.sfa.data_ptr(), ops.b.data_ptr(), ops.sfb.data_ptr(), out.data_ptr(),
            ops.indices.data_ptr(), m, n, k, g, stream)  # fmt: skip
        if status:
            raise RuntimeError(f"DeepGEMM launcher: {self._lib.mxdg_last_error().decode()} (code {status})")
        return out


def _check_operands(ops: Operands, m: int, n: int, k: int, k_: int, g: int) -> None:
    """The launcher takes raw pointers: every layout it assumes is checked here, where a wrong one is a message and not
    a wrong answer or a fault."""
    if k != k_ or ops.a.dtype != DATA_DTYPE or ops.b.dtype != DATA_DTYPE:
        raise ValueError(f"a {tuple(ops.a.shape)} {ops.a.dtype} and b {tuple(ops.b.shape)} {ops.b.dtype}: need e4m3, "
                         "shared K")  # fmt: skip
    if not (ops.a.is_contiguous() and ops.b.is_contiguous() and ops.sfb.is_contiguous()):
        raise ValueError("a, b and sfb must be contiguous")
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    if ops.sfa.shape != (m, kb) or ops.sfa.stride() != (1, -(-m // 4) * 4) or ops.sfa.dtype != torch.float32:
        raise ValueError(f"sfa {tuple(ops.sfa.shape)} strides {ops.sfa.stride()}: need sfa_mn_major's layout")
    if ops.sfb.shape != (g, nb, kb) or ops.sfb.dtype != torch.float32:
        raise ValueError(f"sfb {tuple(ops.sfb.shape)}: need ({g}, {nb}, {kb}) float32")
    if ops.indices.shape != (m,) or ops.indices.dtype != torch.int32 or not ops.indices.is_contiguous():
        raise ValueError("m_indices must be (M,) int32, contiguous")
    devices = {t.device for t in (ops.a, ops.sfa, ops.b, ops.sfb, ops.indices)}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(f"all operands on one CUDA device, not {devices}")


_LOADED: Library | None = None


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV, _DEFAULT_LIBRARY))


def load() -> Library:
    """The launcher library, loaded once; ``PeerUnavailable`` says why it cannot run here."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    path = library_path()
    if not path.is_file():
        raise PeerUnavailable(f"{path} not built (bash scripts/peers/build_deepgemm.sh, sources in .peers/src)")
    if not torch.cuda.is_available():
        raise PeerUnavailable("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        raise PeerUnavailable(
            f"built for sm_90a; this card is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
        )
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    if sms != NUM_SMS:
        # the persistent scheduler's stride is a template constant: another count runs, but not as DeepGEMM would
        raise PeerUnavailable(f"built for {NUM_SMS} SMs (H100 SXM, H200); this card has {sms}")
    _LOADED = Library(path)
    return _LOADED
