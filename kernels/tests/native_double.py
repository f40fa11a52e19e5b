"""A double of the native backend's torch calls as the SM100 kernels are reported to behave, and what the tests of
the SM100 guards (test_native_guards.py) and of native MXFP8's probe (test_native_probe.py) share.

No B200 is lent here, so ``gemm_native.ops`` -- the seam in front of ``torch._scaled_grouped_mm`` and
``torch._grouped_mm`` -- gets a double that misbehaves the ways a desk check of torch's and fbgemm's source says the
SM100 kernels do:

* a 2D x 2D group with no tokens is never written (torch allocates the output uninitialized);
* 2D x 3D ``_scaled_grouped_mm`` (MXFP8 and FP8 rowwise) with fewer rows than experts returns the whole output
  unwritten (fbgemm's ``M /= G; if (M == 0) return output;``);
* offs the kernel cannot take (decreasing, past the operand, 2D x 2D sizes off its alignment) trip its device-side
  assert: the double raises and records a dead CUDA context.

Where it writes, the double writes the emulation's bf16 answer, so every guarded output is compared with the
``backend="emulated"`` reference. Offs are "CUDA-like": they say they are on the GPU (so nothing checks them on the
host) and fail the test if the host reads their values, as a CUDA-graph capture would.

``kernels/tests/fixtures`` holds real ``torch.__config__.show()`` texts (fixtures/README.md says where each came from).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from mxkernels.gemm import emulated
from mxkernels.gemm import native as gemm_native
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.core.format import BLOCK_SIZE, quantize_reference
from mxkernels.quant.fp8_rowwise import quantize_fp8_rowwise_k_groups_reference, quantize_fp8_rowwise_reference
from mxkernels.layouts.scale_layout import rearrange_3d_reference, rearrange_k_groups_reference, rearrange_m_groups_reference

UNWRITTEN = 0x5A5A  # bf16 bits of ~1.5e16: what the double leaves where a kernel would leave memory unwritten
SM100, SM90 = (10, 0), (9, 0)
FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


# The build every committed GPU run recorded, as torch.__config__.show() printed it on the device.
TORCH_2_11_CU130 = "torch-2.11.0+cu130-config.txt"

# ---- CUDA-like offs ------------------------------------------------------------------------------------------


class HostRead(AssertionError):
    pass


HOST_READS = frozenset({
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.nonzero, torch.Tensor.numpy, torch.Tensor.cpu, torch.nonzero,
    torch.Tensor.unique, torch.unique, torch.masked_select, torch.Tensor.masked_select,
})  # fmt: skip


class CudaLikeOffs(torch.Tensor):
    """int32 offs that report ``is_cuda`` (so no check reads them on the host) and raise ``HostRead`` on every way
    the host reads a tensor's values or sizes by its values. Kernels (the Triton interpreter, the double) read the
    storage, as a GPU kernel would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.is_cuda.__get__:
            return True
        if func in HOST_READS:
            raise HostRead(f"{getattr(func, '__name__', func)} read CUDA offs on the host (a sync)")
        return super().__torch_function__(func, types, args, kwargs or {})


def cuda_like(offs: torch.Tensor) -> torch.Tensor:
    return offs.as_subclass(CudaLikeOffs)


def device_values(offs: torch.Tensor) -> list[int]:
    """The values of (CUDA-like) offs as a kernel sees them: read from storage, past the host-read trap."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.tolist(offs.as_subclass(torch.Tensor))


def plain(offs: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return offs.as_subclass(torch.Tensor).clone()


# ---- the double ----------------------------------------------------------------------------------------------


def unwritten(*shape) -> torch.Tensor:
    return torch.full(shape, UNWRITTEN, dtype=torch.int16).view(torch.bfloat16)


def bounds(ends):
    return list(zip([0, *ends[:-1]], ends))


class DeadContext(RuntimeError):
    pass


class SM100Double:
    """torch's native grouped GEMMs as the SM100 kernels are reported to behave (module doc), in a build whose
    ``torch.__config__.show()`` is ``config`` (default: the real text of torch 2.11.0+cu130). ``calls`` records
    (op, case, rows, G, ends) of every call, as the kernel saw it."""

    def __init__(self, config: str | None = None):
        self.config = fixture_text(TORCH_2_11_CU130) if config is None else config
        self.offs_seen: list[list[int]] = []
        self.calls: list[tuple[str, str, int, int, list[int]]] = []
        self.dead = False

    def build_config(self) -> str:
        return self.config

    def _kernel_reads(self, offs, total, multiple=1, exempt_last=False):
        """The kernel's device-side asserts on offs: a failure kills the CUDA context."""
        ends = device_values(offs)
        self.offs_seen.append(ends)
        for g, (start, end) in enumerate(bounds(ends)):
            aligned = (end - start) % multiple == 0 or (exempt_last and g == len(ends) - 1)
            if end < start or end > total or not aligned:
                self.dead = True
                raise DeadContext(f"device-side assert triggered (group {g}: [{start}, {end}) of {total})")
        return ends

    def scaled_grouped_mm(self, a, b, scale_a, scale_b, *, offs, out_dtype, use_fast_accum=False):
        G = offs.numel()
        mx = scale_a.dtype == torch.float8_e8m0fnu  # else FP8 rowwise: fp32 scales
        op = "mxfp8" if mx else "fp8_rowwise"
        if b.dim() == 3:  # 2D x 3D: a (M, K), b (G, K, N), a transposed view of (G, N, K)
            M, N = a.shape[0], b.shape[2]
            ends = self._kernel_reads(offs, M)
            self.calls.append((op, "2d3d", M, G, ends))
            out = unwritten(M, N)
            if M // G == 0:
                return out  # fbgemm: "normalized jagged dim for heuristics", then an early return
            if mx:
                b_sb = scale_b.view(torch.uint8).reshape(G, -1, scale_a.shape[1])
                ref = emulated.run_mxfp8(a, scale_a, b.transpose(-2, -1), b_sb, plain(offs), torch.bfloat16)
            else:
                ref = emulated.run_fp8_rowwise(a, scale_a, b.transpose(-2, -1), scale_b, plain(offs),
                                                    torch.bfloat16)  # fmt: skip
            for start, end in bounds(ends):
                out[start:end] = ref[start:end]
            return out
        # 2D x 2D: a (N, M), b (M, K), a transposed view of (K, M)
        if mx:
            ends = self._kernel_reads(offs, a.shape[1], BLOCK_SIZE)
            ref = emulated.run_mxfp8(a, scale_a, b.t(), scale_b, plain(offs), torch.bfloat16)
        else:  # 16 bytes of e4m3 along the contiguous contraction dim, the last group excepted (as for bf16)
            ends = self._kernel_reads(offs, a.shape[1], 16, exempt_last=True)
            ref = emulated.run_fp8_rowwise(a, scale_a.reshape(G, -1), b.t(), scale_b.reshape(G, -1),
                                                plain(offs), torch.bfloat16)  # fmt: skip
        self.calls.append((op, "2d2d", a.shape[1], G, ends))
        return self._groups_written(ref, ends)

    def _groups_written(self, ref, ends):
        out = unwritten(*ref.shape)
        for g, (start, end) in enumerate(bounds(ends)):
            if end > start:  # only non-empty groups get a problem set up; a K = 0 one is never written
                out[g] = ref[g]
        return out

    def grouped_mm(self, a, b, *, offs):
        G = offs.numel()
        if b.dim() == 3:
            ends = self._kernel_reads(offs, a.shape[0], 8 if a.stride(-1) != 1 else 1, exempt_last=True)
            self.calls.append(("bf16", "2d3d", a.shape[0], G, ends))
            out = unwritten(a.shape[0], b.shape[2])
            ref = emulated.grouped_matmul_fp32(a, b, plain(offs), torch.bfloat16)
            for start, end in bounds(ends):
                out[start:end] = ref[start:end]
            return out
        moves = a.stride(-1) == 1 or b.stride(-1) != 1
        ends = self._kernel_reads(offs, a.shape[1], 8 if moves else 1, exempt_last=True)
        self.calls.append(("bf16", "2d2d", a.shape[1], G, ends))
        return self._groups_written(emulated.grouped_matmul_fp32(a, b, plain(offs), torch.bfloat16), ends)


def install(monkeypatch, double: SM100Double) -> SM100Double:
    """``double`` as the torch calls of a compute capability 10.x device (``grouped_gemm`` asks
    ``gemm_native.capability`` too), not yet probed."""
    monkeypatch.setattr(gemm_native, "ops", double)
    monkeypatch.setattr(gemm_native, "capability", lambda device: SM100)
    monkeypatch.setattr(gemm_native, "_PROBES", {})
    return double


# ---- operands ------------------------------------------------------------------------------------------------


def ends_of(sizes) -> torch.Tensor:
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def mx_case(case, sizes, seed=0, rows=None, K=64, N=48, R=40):
    """MXFP8 operands of ``mxfp8_scaled_grouped_mm`` (blocked scales from the plain-torch references) and offs.
    2D x 3D: a (rows or sum(sizes), K) @ w (G, N, K); 2D x 2D: x (N, M) and y (R, M), M = sum(sizes)."""
    gen = torch.Generator().manual_seed(seed)
    offs, G = ends_of(sizes), len(sizes)
    if case == "2d3d":
        a_q, a_s = quantize_reference(torch.randn(sum(sizes) if rows is None else rows, K, generator=gen))
        w_q, w_s = quantize_reference(torch.randn(G, N, K, generator=gen))
        ops = {"a_q": a_q, "a_sb": rearrange_m_groups_reference(a_s, offs), "b_q": w_q,
               "b_sb": rearrange_3d_reference(w_s)}  # fmt: skip
    else:
        M = sum(sizes)
        x_q, x_s = quantize_reference(torch.randn(N, M, generator=gen))
        y_q, y_s = quantize_reference(torch.randn(R, M, generator=gen))
        ops = {"a_q": x_q, "a_sb": rearrange_k_groups_reference(x_s, offs), "b_q": y_q,
               "b_sb": rearrange_k_groups_reference(y_s, offs)}  # fmt: skip
    return ops, offs


def fp8_case(case, sizes, seed=0, rows=None, K=64, N=48, R=32):
    """FP8 rowwise operands of ``fp8_rowwise_scaled_grouped_mm`` (from the plain-torch references) and offs.
    2D x 3D: a (rows or sum(sizes), K) @ w (G, N, K); 2D x 2D: x (N, M) and y (R, M) with per-group row scales."""
    gen = torch.Generator().manual_seed(seed)
    offs, G = ends_of(sizes), len(sizes)
    if case == "2d3d":
        a_q, a_scale = quantize_fp8_rowwise_reference(torch.randn(sum(sizes) if rows is None else rows, K,
                                                                  generator=gen))  # fmt: skip
        w_q, w_scale = quantize_fp8_rowwise_reference(torch.randn(G, N, K, generator=gen))
        return {"a_q": a_q, "a_scale": a_scale, "b_q": w_q, "b_scale": w_scale}, offs
    M = sum(sizes)
    a_q, a_scale = quantize_fp8_rowwise_k_groups_reference(torch.randn(M, N, generator=gen), offs)
    b_q, b_scale = quantize_fp8_rowwise_k_groups_reference(torch.randn(M, R, generator=gen), offs)
    return {"a_q": a_q, "a_scale": a_scale, "b_q": b_q, "b_scale": b_scale}, offs


def same_bits(x, y):
    return torch.equal(x.view(torch.int16), y.view(torch.int16))


def mx_native(ops, offs):
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=cuda_like(offs), backend="native")


def mx_emulated(ops, offs):
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated")
