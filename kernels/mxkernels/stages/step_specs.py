"""What each stage of a training step computes: the declarations every implementation is held to.

A ``StageSpec`` says *what* a stage must compute, never how fast: its recipe, pass and category (Enums), its named
inputs and outputs (the names the pipeline's tensors go by), the keyword parameters of its calling contract, its
oracle (the plain-torch reference, written for clarity) and how an output is compared with the oracle's (bit for bit
for quantize, rearrange and pad; an SQNR floor for GEMMs, whose sums may be ordered differently).

**The calling contract** of every implementation of a stage, ours included: ``fn(*inputs, **params)`` with the
stage's input tensors positionally in the order of ``spec.inputs`` and its ``spec.params`` as keywords (``mode`` for
MX quantize stages, ``alignment`` for pad, ``num_tokens`` for unpad); it returns the stage's outputs as a tuple in
the order of ``spec.outputs``. ``spec.signature()`` prints it, e.g. ``quantize_a(a, *, mode) -> (a_q, a_s)``.

mxkernels' own implementation of each stage is ``spec.impl`` (what the pipeline runs unless told otherwise); the
harness registers it beside other implementations of the same contract. Shapes and costs belong to a stage *in a
step* (``pipeline.Stage``), not to its spec.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from ..gemm import grouped_gemm
from ..layouts import scale_layout, padding
from ..quant import fp8_amax, fp8_rowwise, quantize, quantize_blocked
from ..reference import gemm as gemm_reference
from ..core.comparison import BitExact, MinSQNR, Mismatch, Rule, sqnr_db
from ..core.format import BLOCK_SIZE, quantize_reference
from ..core.names import (
    WEIGHT_ONLY_STAGES,
    Category,
    Pass,
    Recipe,
)

# ---------------------------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------------------------


PARAM_DOCS = {
    "mode": "the MX scale mode, 'rceil' or 'floor' (str)",
    "alignment": "the token-group alignment the GEMM needs, 16 or 32 (int)",
    "num_tokens": "rows of the unpadded output, M (int)",
}
"""What each keyword parameter of a calling contract holds."""


@dataclass(frozen=True)
class Port:
    """A named tensor of a stage's contract and what it holds."""

    name: str
    doc: str


Region = Callable[[Sequence[torch.Tensor]], tuple]
"""Part of an output that the contract specifies, from the stage's inputs (e.g. the rows up to ``offs[-1]``); the
rest of the buffer is unspecified and never compared."""


class StageImpl(Protocol):
    """What the pipeline needs of an implementation to run it in place of ``spec.impl``."""

    name: str
    kernel: str
    fn: Callable[..., tuple]


@dataclass(frozen=True)
class StageSpec:
    recipe: Recipe
    name: str
    pass_: Pass
    category: Category
    purpose: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    oracle: Callable[..., tuple]
    rule: Rule
    impl: Callable[..., tuple]
    kernel: str
    params: tuple[str, ...] = ()
    regions: Mapping[str, Region] = field(default_factory=dict)
    finite_inputs: bool = False
    """True where the contract holds for finite inputs only (no NaN / Inf among the checks' adversarial blocks)."""
    locate: Callable[[str, tuple[int, ...]], tuple[int, tuple]] | None = None
    """(output name, output index) -> (input position, index or slices of that input) that produced it."""
    weights_only: bool = False
    """True where every input is an expert weight or made from weights alone (``WEIGHT_ONLY_STAGES``): the outputs
    change only when the weights do, once per optimizer step, so a trainer accumulating gradients over microbatches
    computes them once and reuses them (Transformer Engine's first-microbatch caching; ``mxbench layer
    --microbatches``)."""

    @property
    def key(self) -> tuple[Recipe, str]:
        return (self.recipe, self.name)

    def signature(self) -> str:
        args = ", ".join(p.name for p in self.inputs)
        if self.params:
            args += ", *, " + ", ".join(self.params)
        return f"{self.name}({args}) -> ({', '.join(p.name for p in self.outputs)})"

    def _regioned(self, got, expected, inputs):
        for port, g, e in zip(self.outputs, got, expected, strict=True):
            region = self.regions.get(port.name)
            if region is not None and isinstance(g, torch.Tensor) and tuple(g.shape) == tuple(e.shape):
                where = region(inputs)
                g, e = g[where], e[where]
            yield port.name, g, e

    def sqnr(self, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], inputs) -> list[float]:
        """SQNR in dB of each output against the oracle's, in its specified region."""
        return [sqnr_db(g, e) for _, g, e in self._regioned(got, expected, inputs)]

    def mismatches(self, got: Sequence[object], expected: Sequence[torch.Tensor],
                   inputs: Sequence[torch.Tensor]) -> list[Mismatch]:  # fmt: skip
        """The first ``Mismatch`` of every output of ``got`` (an implementation's return value) that differs from
        the oracle's ``expected``, in output order (empty: all match). Outputs are compared in their specified
        regions only."""
        if not isinstance(got, tuple) or len(got) != len(self.outputs):
            n = len(got) if isinstance(got, (tuple, list)) else "not a tuple"
            return [Mismatch("(return)", f"must return a tuple of {len(self.outputs)} tensors "
                             f"({', '.join(p.name for p in self.outputs)}); got {n}")]  # fmt: skip
        found = (self.rule.compare(name, g, e) for name, g, e in self._regioned(got, expected, inputs))
        return [m for m in found if m is not None]

    def compare(self, got: Sequence[object], expected: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]):
        """The first of ``mismatches``, or None."""
        return next(iter(self.mismatches(got, expected, inputs)), None)


# ---------------------------------------------------------------------------------------------------------------
# Oracles and region helpers
# ---------------------------------------------------------------------------------------------------------------


def _rows_until_last_offset(inputs: Sequence[torch.Tensor]) -> tuple:
    return (slice(0, int(inputs[-1][-1])),)


def _cols_until_last_offset(inputs: Sequence[torch.Tensor]) -> tuple:
    return (slice(None), slice(0, int(inputs[-1][-1])))


def _mx_rows(x, *, mode):
    return quantize_reference(x, mode)


def _mx_transposed(x, *, mode):
    q, s = quantize_reference(x.t().contiguous(), mode)
    return q, s


def _mx_along_n(w, *, mode):
    return quantize_reference(w.transpose(1, 2).contiguous(), mode)


def _mx_data_locate(kind: str):
    """``_mx_locate`` for a fused-scale quantizer: its data as the unfused one's; its blocked scales are not traced
    back to their inputs (a ValueError, which the check reads as "no input to show")."""
    data = _mx_locate(kind)

    def locate(output: str, index: tuple[int, ...]) -> tuple[int, tuple]:
        if output.endswith("_sb"):
            raise ValueError(f"{output} is a blocked layout")
        return data(output, index)

    return locate


def _bf16_gemm(matmul):
    """A bf16 GEMM stage's contract over ``matmul(a, b, offs, **options) -> out`` (``torch._grouped_mm``
    semantics), for the three cases' operand forms; ``options`` (ours: ``backend``) go to ``matmul``."""

    def gemm(x, w, offs, *, case, **options):
        a, b = {"fwd": (x, w.transpose(-2, -1)), "dgrad": (x, w), "wgrad": (x.t(), w)}[case]
        return (matmul(a, b, offs, **options),)

    return gemm


def _mx_locate(kind: str):
    """Which input elements produced an MX quantizer's output element: along the last dim ("rows"), transposed 2D
    ("t"), or 3D along N ("n")."""

    def locate(output: str, index: tuple[int, ...]) -> tuple[int, tuple]:
        scale = output.endswith("_s")
        *lead, i, j = index
        if kind == "rows":
            return 0, (*lead, i, slice(j * BLOCK_SIZE, (j + 1) * BLOCK_SIZE) if scale else j)
        # transposed: out[j_in, i_in] <- x[i_in, j_in] (3D: per expert)
        return 0, (*lead, slice(j * BLOCK_SIZE, (j + 1) * BLOCK_SIZE) if scale else j, i)

    return locate


def _rowwise_locate(output: str, index: tuple[int, ...]) -> tuple[int, tuple]:
    if output.endswith("_q"):
        return 0, index
    if output.endswith("_amax"):
        # A ValueError: the check reads it as "no input to show" (a column of a group, not one input block).
        raise ValueError(f"{output} reduces a column of a group")
    return 0, (*index, slice(None))


# ---------------------------------------------------------------------------------------------------------------
# The declarations
# ---------------------------------------------------------------------------------------------------------------

_BF16 = "bf16"
_E4M3 = "float8_e4m3fn"
_E8M0 = "float8_e8m0fnu"
_OFFS = Port("offs", "int32 (G,) cumulative group ends of the token dim (of the padded buffer when the step pads)")
_MX_GEMM_FLOOR_DB = 60.0  # exact products, fp32 sums: only the order of the sums and the bf16 output may differ
_FP8_GEMM_FLOOR_DB = 40.0  # Hopper's fp8 tensor cores accumulate with fewer fp32 bits
_BF16_GEMM_FLOOR_DB = 50.0  # bf16 output rounding of fp32 sums taken in another order


def _pads(recipe: Recipe) -> list[StageSpec]:
    align = padding_alignment(recipe)
    specs = []
    for pass_, name, src, what in ((Pass.FORWARD, "pad_a", "a", "A"),
                                   (Pass.BACKWARD_INPUT, "pad_grad_out", "grad_out", "grad_out")):  # fmt: skip
        specs.append(StageSpec(
            recipe, name, pass_, Category.PAD, f"Pad {what} token groups to multiples of {align}",
            (Port(src, f"{_BF16} (M, D) tokens, grouped by expert"), Port("offs", "int32 (G,) group ends")),
            (Port(f"{src}_p", f"{_BF16} (ceil_a(M + a*G), D): group g at the start of its slot, zeros elsewhere"),
             Port("offs_p", "int32 (G,) slot ends")),
            padding.pad_token_groups_reference, BitExact(), padding.pad_token_groups, "pad_token_groups", params=("alignment",),
        ))  # fmt: skip
    for pass_, name, what in ((Pass.FORWARD, "unpad_out", "the output"), (Pass.BACKWARD_INPUT, "unpad_grad_a",
                                                                          "grad_a")):  # fmt: skip
        specs.append(StageSpec(
            recipe, name, pass_, Category.PAD, f"Unpad {what}",
            (Port("x_p", f"{_BF16} (rows, D) padded rows"), Port("offs", "int32 (G,) group ends"),
             Port("offs_p", "int32 (G,) slot ends")),
            (Port("x", f"{_BF16} (num_tokens, D)"),),
            lambda x, o, op, *, num_tokens: (padding.unpad_token_groups_reference(x, o, op, num_tokens),),
            BitExact(), lambda x, o, op, *, num_tokens: (padding.unpad_token_groups(x, o, op, num_tokens),),
            "unpad_token_groups", params=("num_tokens",),
        ))  # fmt: skip
    return specs


def padding_alignment(recipe: str) -> int:
    """Token-group alignment a recipe's backward-weight GEMM needs: an MX block must not straddle two experts;
    FP8 rowwise and bf16 need 16-byte-aligned contraction groups (TMA)."""
    return {Recipe.MXFP8: 32, Recipe.FP8_ROWWISE: 16, Recipe.BF16: 16}[Recipe(recipe)]


def _mx_quantize(name, pass_, purpose, src, out, kind, impl, kernel, shape_in, shape_out, scales) -> StageSpec:
    oracle = {"rows": _mx_rows, "t": _mx_transposed, "n": _mx_along_n}[kind]
    return StageSpec(
        Recipe.MXFP8, name, pass_, Category.QUANTIZE, purpose, (Port(src, f"{_BF16} {shape_in}, row-major"),),
        (Port(f"{out}_q", f"{_E4M3} {shape_out}"), Port(f"{out}_s", f"{_E8M0} {scales}")),
        oracle, BitExact(), impl, kernel, params=("mode",), locate=_mx_locate("rows" if kind == "rows" else "t"),
    )  # fmt: skip


def _mx_quantize_blocked(name, pass_, purpose, src, out, layout, shape_in, shape_out) -> StageSpec:
    """A fused-scale quantizer: the unfused quantize and rearrange stages of ``out`` in one call (``quantize_blocked``),
    its oracle the reference quantizer followed by the reference rearrange. ``layout``: "m" (dim0, M-groups), "3d_K",
    "3d_N" (weights) or "k" (dim1, K-groups)."""
    qb = quantize_blocked
    impl, oracle, kernel = {
        "m": (qb.quantize_dim0_blocked, qb.quantize_dim0_blocked_reference, "quantize_dim0_blocked"),
        "k": (qb.quantize_dim1_blocked, qb.quantize_dim1_blocked_reference, "quantize_dim1_blocked"),
        "3d_K": (functools.partial(qb.quantize_3d_blocked, along="K"),
                 functools.partial(qb.quantize_3d_blocked_reference, along="K"), "quantize_3d_blocked(along=K)"),
        "3d_N": (functools.partial(qb.quantize_3d_blocked, along="N"),
                 functools.partial(qb.quantize_3d_blocked_reference, along="N"), "quantize_3d_blocked(along=N)"),
    }[layout]  # fmt: skip
    blocked = {
        "m": "M-groups (128 * (ceil(M/128) + G), ceil_4(C)): group g's image from row sum_{j<g} ceil_128(size_j)",
        "k": "K-groups (ceil_128(R), M/32 + 4G): the groups' blocked images back to back from byte 0",
        "3d_K": "(G, ceil_128(N), ceil_4(K/32)) blocked image per expert",
        "3d_N": "(G, ceil_128(K), ceil_4(N/32)) blocked image per expert",
    }[layout]
    ins = (Port(src, f"{_BF16} {shape_in}, row-major"),) + ((_OFFS,) if layout in ("m", "k") else ())
    unspecified = {"m": ("rows", _rows_until_last_offset), "k": ("columns", _cols_until_last_offset)}.get(layout)
    q_doc = f"{_E4M3} {shape_out}" + (f"; {unspecified[0]} past offs[-1] unspecified" if unspecified else "")
    regions = {f"{out}_q": unspecified[1]} if unspecified else {}
    kind = {"m": "rows", "3d_K": "rows", "k": "t", "3d_N": "t"}[layout]
    return StageSpec(
        Recipe.MXFP8, name, pass_, Category.QUANTIZE, purpose, ins,
        (Port(f"{out}_q", q_doc), Port(f"{out}_sb", f"{_E8M0} {blocked}; zeros elsewhere")),
        oracle, BitExact(), impl, kernel, params=("mode",), regions=regions, locate=_mx_data_locate(kind),
    )  # fmt: skip


def _mx_rearrange(name, pass_, purpose, src, layout) -> StageSpec:
    if layout == "3d":
        ins = (Port(f"{src}_s", f"{_E8M0} (G, R, C) scales"),)
        ref, impl, kernel = scale_layout.rearrange_3d_reference, scale_layout.rearrange_3d, "rearrange_3d"
        what = "(G, ceil_128(R), ceil_4(C)) blocked image per expert"
    elif layout == "m":
        ins = (Port(f"{src}_s", f"{_E8M0} (M, C) scales, row-major"), _OFFS)
        ref, impl, kernel = scale_layout.rearrange_m_groups_reference, scale_layout.rearrange_m_groups, "rearrange_m_groups"
        what = "(128 * (ceil(M/128) + G), ceil_4(C)): group g's image from row sum_{j<g} ceil_128(size_j)"
    else:
        ins = (Port(f"{src}_s", f"{_E8M0} (R, M/32) scales, row- or column-major"), _OFFS)
        ref, impl, kernel = scale_layout.rearrange_k_groups_reference, scale_layout.rearrange_k_groups, "rearrange_k_groups"
        what = "(ceil_128(R), M/32 + 4G): the groups' blocked images back to back from byte 0"
    return StageSpec(Recipe.MXFP8, name, pass_, Category.REARRANGE, purpose, ins,
                     (Port(f"{src}_sb", f"{_E8M0} {what}; zeros elsewhere"),),
                     lambda *xs: (ref(*xs),), BitExact(), lambda *xs: (impl(*xs),), kernel)  # fmt: skip


def _gemm(recipe, name, pass_, purpose, ins, out, oracle, impl, kernel, floor, two_d_three_d=True) -> StageSpec:
    regions = {out.name: _rows_until_last_offset} if two_d_three_d else {}
    rule = MinSQNR(floor, per_slice=not two_d_three_d)  # 2D x 2D: (G, N, K), one weight gradient per expert
    return StageSpec(recipe, name, pass_, Category.GEMM, purpose, ins, (out,), oracle, rule, impl, kernel,
                     regions=regions)  # fmt: skip


def _mx_gemm_impl(*args, backend=None, config=None):
    return (grouped_gemm.mxfp8_scaled_grouped_mm(*args, backend=backend, config=config),)


def _fp8_gemm_impl(*args, backend=None, config=None):
    return (grouped_gemm.fp8_rowwise_scaled_grouped_mm(*args, backend=backend, config=config),)


def _mxfp8() -> list[StageSpec]:
    F, DI, DW, R = Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT, Recipe.MXFP8
    dim0, dim1 = quantize.quantize_dim0, quantize.quantize_dim1
    along_k = functools.partial(quantize.quantize_3d, along="K")
    along_n = functools.partial(quantize.quantize_3d, along="N")
    mx = lambda q, s, what: (Port(q, f"{_E4M3} {what}, K contiguous"), Port(s, f"{_E8M0} blocked scales"))
    return [
        _mx_quantize("quantize_a", F, "Quantize A (activations) along K", "a", "a", "rows", dim0, "quantize_dim0",
                     "(M, K)", "(M, K)", "(M, K/32), row-major"),
        _mx_quantize("quantize_w", F, "Quantize B (weights) along K", "w", "w", "rows", along_k,
                     "quantize_3d(along=K)", "(G, N, K)", "(G, N, K)", "(G, N, K/32)"),
        _mx_rearrange("rearrange_a", F, "Convert A scales to blocked layout", "a", "m"),
        _mx_rearrange("rearrange_w", F, "Convert B scales to blocked layout", "w", "3d"),
        _gemm(R, "gemm_fwd", F, "2D x 3D scaled grouped GEMM", (*mx("a_q", "a_sb", "(M, K)"),
              *mx("w_q", "w_sb", "(G, N, K)"), _OFFS), Port("out", f"{_BF16} (M, N); rows past offs[-1] unspecified"),
              gemm_reference.mxfp8_oracle, _mx_gemm_impl, "mxfp8_scaled_grouped_mm", _MX_GEMM_FLOOR_DB),
        _mx_quantize("quantize_grad_out", DI, "Quantize grad_out along N", "grad_out", "dy", "rows", dim0,
                     "quantize_dim0", "(M, N)", "(M, N)", "(M, N/32), row-major"),
        _mx_quantize("quantize_w_t", DI, "Quantize B (weights) along N", "w", "wt", "n", along_n,
                     "quantize_3d(along=N)", "(G, N, K)", "(G, K, N)", "(G, K, N/32)"),
        _mx_rearrange("rearrange_grad_out", DI, "Convert grad_out scales to blocked layout", "dy", "m"),
        _mx_rearrange("rearrange_w_t", DI, "Convert B scales to blocked layout", "wt", "3d"),
        _gemm(R, "gemm_dgrad", DI, "2D x 3D scaled grouped GEMM", (*mx("dy_q", "dy_sb", "(M, N)"),
              *mx("wt_q", "wt_sb", "(G, K, N)"), _OFFS),
              Port("grad_a", f"{_BF16} (M, K); rows past offs[-1] unspecified"),
              gemm_reference.mxfp8_oracle, _mx_gemm_impl, "mxfp8_scaled_grouped_mm", _MX_GEMM_FLOOR_DB),
        _mx_quantize("quantize_grad_out_t", DW, "Quantize grad_out along M (output transposed)", "grad_out", "dyt",
                     "t", dim1, "quantize_dim1", "(M, N)", "(N, M)", "(N, M/32), any layout"),
        _mx_quantize("quantize_a_t", DW, "Quantize A along M (output transposed)", "a", "at", "t", dim1,
                     "quantize_dim1", "(M, K)", "(K, M)", "(K, M/32), any layout"),
        _mx_rearrange("rearrange_grad_out_t", DW, "Convert grad_out_t scales to blocked layout", "dyt", "k"),
        _mx_rearrange("rearrange_a_t", DW, "Convert A_t scales to blocked layout", "at", "k"),
        _gemm(R, "gemm_wgrad", DW, "2D x 2D scaled grouped GEMM", (*mx("dyt_q", "dyt_sb", "(N, M)"),
              *mx("at_q", "at_sb", "(K, M)"), _OFFS), Port("grad_w", f"{_BF16} (G, N, K); empty groups zero"),
              gemm_reference.mxfp8_oracle, _mx_gemm_impl, "mxfp8_scaled_grouped_mm", _MX_GEMM_FLOOR_DB,
              two_d_three_d=False),
        *_mx_fused(),
        *_pads(R),
    ]  # fmt: skip


def _mx_fused() -> list[StageSpec]:
    """The fused-scale quantizers of a step run with ``fuse_scales``: each replaces a quantize and its rearrange."""
    F, DI, DW = Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT
    return [
        _mx_quantize_blocked("quantize_a_blocked", F, "Quantize A along K, scales blocked (M-groups)", "a", "a", "m",
                             "(M, K)", "(M, K)"),
        _mx_quantize_blocked("quantize_w_blocked", F, "Quantize B along K, scales blocked (3D)", "w", "w", "3d_K",
                             "(G, N, K)", "(G, N, K)"),
        _mx_quantize_blocked("quantize_grad_out_blocked", DI, "Quantize grad_out along N, scales blocked (M-groups)",
                             "grad_out", "dy", "m", "(M, N)", "(M, N)"),
        _mx_quantize_blocked("quantize_w_t_blocked", DI, "Quantize B along N, scales blocked (3D)", "w", "wt", "3d_N",
                             "(G, N, K)", "(G, K, N)"),
        _mx_quantize_blocked("quantize_grad_out_t_blocked", DW, "Quantize grad_out along M (output transposed), "
                             "scales blocked (K-groups)", "grad_out", "dyt", "k", "(M, N)", "(N, M)"),
        _mx_quantize_blocked("quantize_a_t_blocked", DW, "Quantize A along M (output transposed), scales blocked "
                             "(K-groups)", "a", "at", "k", "(M, K)", "(K, M)"),
    ]  # fmt: skip


def _fp8_rowwise() -> list[StageSpec]:
    F, DI, DW, R = Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT, Recipe.FP8_ROWWISE
    ref = fp8_rowwise.quantize_fp8_rowwise_reference
    k = "quantize_fp8_rowwise"

    def quant(name, pass_, purpose, src, out, impl, oracle, kernel, shape_in, shape_out, scales, ins=None, amax=None,
              **kw):  # fmt: skip
        outs = (Port(f"{out}_q", f"{_E4M3} {shape_out}"), Port(f"{out}_s", f"float32 {scales}"))
        if amax is not None:  # the column amaxes of a tensor's first quantizer, for its second (fp8_amax)
            outs += (Port(f"{out}_amax", f"float32 {amax}: max |{src}| down each column of each group"),)
        return StageSpec(R, name, pass_, Category.QUANTIZE, purpose, ins or (Port(src, f"{_BF16} {shape_in}"),),
                         outs, oracle, BitExact(), impl, kernel, finite_inputs=True, **kw)  # fmt: skip

    def gemm(name, pass_, purpose, a, b, out, shapes, two_d_three_d=True):
        ins = (Port(f"{a}_q", f"{_E4M3} {shapes[0]}"), Port(f"{a}_s", "float32 row scales"),
               Port(f"{b}_q", f"{_E4M3} {shapes[1]}"), Port(f"{b}_s", "float32 row scales"), _OFFS)  # fmt: skip
        return _gemm(R, name, pass_, purpose, ins, out, gemm_reference.fp8_rowwise_oracle, _fp8_gemm_impl,
                     "fp8_rowwise_scaled_grouped_mm", _FP8_GEMM_FLOOR_DB, two_d_three_d)  # fmt: skip

    k_groups_ins = lambda src, shape: (Port(src, f"{_BF16} {shape}"), _OFFS)
    k_groups_regions = lambda out: {f"{out}_q": _cols_until_last_offset}
    along_k = lambda w: fp8_rowwise.quantize_fp8_rowwise_3d(w, along="K")
    along_n = lambda w: fp8_rowwise.quantize_fp8_rowwise_3d(w, along="N")
    return [
        quant("quantize_a", F, "Quantize A rowwise along K", "a", "a", fp8_rowwise.quantize_fp8_rowwise, ref, k,
              "(M, K)", "(M, K)", "(M,)", locate=_rowwise_locate),
        quant("quantize_w", F, "Quantize B rowwise along K", "w", "w", along_k, ref, f"{k}_3d(along=K)",
              "(G, N, K)", "(G, N, K)", "(G, N)", locate=_rowwise_locate),
        gemm("gemm_fwd", F, "2D x 3D FP8 rowwise grouped GEMM", "a", "w",
             Port("out", f"{_BF16} (M, N); rows past offs[-1] unspecified"), ("(M, K)", "(G, N, K)")),
        quant("quantize_grad_out", DI, "Quantize grad_out rowwise along N", "grad_out", "dy",
              fp8_rowwise.quantize_fp8_rowwise, ref, k, "(M, N)", "(M, N)", "(M,)", locate=_rowwise_locate),
        quant("quantize_w_t", DI, "Quantize B rowwise along N", "w", "wt", along_n,
              lambda w: ref(w.transpose(-2, -1)), f"{k}_3d(along=N)", "(G, N, K)", "(G, K, N)", "(G, K)"),
        gemm("gemm_dgrad", DI, "2D x 3D FP8 rowwise grouped GEMM", "dy", "wt",
             Port("grad_a", f"{_BF16} (M, K); rows past offs[-1] unspecified"), ("(M, N)", "(G, K, N)")),
        quant("quantize_grad_out_t", DW, "Quantize grad_out per group along M (output transposed)", "grad_out",
              "dyt", fp8_rowwise.quantize_fp8_rowwise_k_groups, fp8_rowwise.quantize_fp8_rowwise_k_groups_reference,
              f"{k}_k_groups", "(M, N)", "(N, M)", "(G, N)", ins=k_groups_ins("grad_out", "(M, N)"),
              regions=k_groups_regions("dyt")),
        quant("quantize_a_t", DW, "Quantize A per group along M (output transposed)", "a", "at",
              fp8_rowwise.quantize_fp8_rowwise_k_groups, fp8_rowwise.quantize_fp8_rowwise_k_groups_reference,
              f"{k}_k_groups", "(M, K)", "(K, M)", "(G, K)", ins=k_groups_ins("a", "(M, K)"),
              regions=k_groups_regions("at")),
        gemm("gemm_wgrad", DW, "2D x 2D FP8 rowwise grouped GEMM", "dyt", "at",
             Port("grad_w", f"{_BF16} (G, N, K); empty groups zero"), ("(N, M)", "(K, M)"), two_d_three_d=False),
        # The fuse_scales step's quantizers (fp8_amax): each tensor's first also folds its column amaxes, the
        # second (transposed) scales from them.
        quant("quantize_a_amax", F, "Quantize A rowwise along K, and fold its column amax per group", "a", "a",
              fp8_amax.quantize_fp8_rowwise_with_amax, fp8_amax.quantize_fp8_rowwise_with_amax_reference,
              f"{k}_with_amax", "(M, K)", "(M, K)", "(M,)", ins=k_groups_ins("a", "(M, K)"), amax="(G, K)",
              locate=_rowwise_locate),
        quant("quantize_w_amax", F, "Quantize B rowwise along K, and fold its column amax per expert", "w", "w",
              fp8_amax.quantize_fp8_rowwise_3d_with_amax, fp8_amax.quantize_fp8_rowwise_3d_with_amax_reference,
              f"{k}_3d_with_amax", "(G, N, K)", "(G, N, K)", "(G, N)", amax="(G, K)", locate=_rowwise_locate),
        quant("quantize_grad_out_amax", DI, "Quantize grad_out rowwise along N, and fold its column amax per group",
              "grad_out", "dy", fp8_amax.quantize_fp8_rowwise_with_amax,
              fp8_amax.quantize_fp8_rowwise_with_amax_reference, f"{k}_with_amax", "(M, N)", "(M, N)", "(M,)",
              ins=k_groups_ins("grad_out", "(M, N)"), amax="(G, N)", locate=_rowwise_locate),
        quant("quantize_w_t_from_amax", DI, "Quantize B rowwise along N, scaled from its column amax", "w", "wt",
              fp8_amax.quantize_fp8_rowwise_3d_from_amax, fp8_amax.quantize_fp8_rowwise_3d_from_amax_reference,
              f"{k}_3d_from_amax", "(G, N, K)", "(G, K, N)", "(G, K)",
              ins=(Port("w", f"{_BF16} (G, N, K)"), _amax_port("w", "(G, K)"))),
        quant("quantize_grad_out_t_from_amax", DW, "Quantize grad_out per group along M (output transposed), scaled "
              "from its column amax", "grad_out", "dyt", fp8_amax.quantize_fp8_rowwise_k_groups_from_amax,
              fp8_amax.quantize_fp8_rowwise_k_groups_from_amax_reference, f"{k}_k_groups_from_amax", "(M, N)",
              "(N, M)", "(G, N)", ins=(Port("grad_out", f"{_BF16} (M, N)"), _amax_port("dy", "(G, N)"), _OFFS),
              regions=k_groups_regions("dyt")),
        quant("quantize_a_t_from_amax", DW, "Quantize A per group along M (output transposed), scaled from its "
              "column amax", "a", "at", fp8_amax.quantize_fp8_rowwise_k_groups_from_amax,
              fp8_amax.quantize_fp8_rowwise_k_groups_from_amax_reference, f"{k}_k_groups_from_amax", "(M, K)",
              "(K, M)", "(G, K)", ins=(Port("a", f"{_BF16} (M, K)"), _amax_port("a", "(G, K)"), _OFFS),
              regions=k_groups_regions("at")),
        *_pads(R),
    ]  # fmt: skip


def _amax_port(out: str, shape: str) -> Port:
    return Port(f"{out}_amax", f"float32 {shape} column amax per group, as the tensor's first quantizer folded it")


def _bf16() -> list[StageSpec]:
    R = Recipe.BF16
    ours = _bf16_gemm(lambda a, b, offs, backend=None: grouped_gemm.grouped_mm(a, b, offs, "bf16", backend).out)
    oracle = _bf16_gemm(gemm_reference.bf16_reference)  # fp64: no backend checked against itself
    specs = []
    for name, pass_, ins, out, case, shapes in (
        ("gemm_fwd", Pass.FORWARD, ("a", "w"), Port("out", f"{_BF16} (M, N); rows past offs[-1] unspecified"), "fwd",
         ("(M, K)", "(G, N, K)")),
        ("gemm_dgrad", Pass.BACKWARD_INPUT, ("grad_out", "w"), Port("grad_a", f"{_BF16} (M, K)"), "dgrad",
         ("(M, N)", "(G, N, K)")),
        ("gemm_wgrad", Pass.BACKWARD_WEIGHT, ("grad_out", "a"), Port("grad_w", f"{_BF16} (G, N, K)"), "wgrad",
         ("(M, N)", "(M, K)")),
    ):  # fmt: skip
        ports = (Port(ins[0], f"{_BF16} {shapes[0]}"), Port(ins[1], f"{_BF16} {shapes[1]}"), _OFFS)
        purpose = f"2D x {'2D' if case == 'wgrad' else '3D'} bf16 grouped GEMM"
        specs.append(_gemm(R, name, pass_, purpose, ports, out, functools.partial(oracle, case=case),
                           functools.partial(ours, case=case), "torch._grouped_mm", _BF16_GEMM_FLOOR_DB,
                           two_d_three_d=case != "wgrad"))  # fmt: skip
    return [*specs, *_pads(R)]


@functools.cache
def all_specs() -> dict[tuple[Recipe, str], StageSpec]:
    """Every stage spec of the single-GPU step by (recipe, name). The expert-parallel stages are declared the same
    way in ``ep_stages.ep_specs()``, kept apart: their collectives run only inside a process group."""
    specs = (*_mxfp8(), *_fp8_rowwise(), *_bf16())
    return {s.key: replace(s, weights_only=True) if s.name in WEIGHT_ONLY_STAGES else s for s in specs}


def get_spec(recipe: str, name: str) -> StageSpec:
    specs = all_specs()
    key = (Recipe(recipe), name)
    if key not in specs:
        known = ", ".join(n for r, n in specs if r == key[0])
        from ..core.runtime import InputError

        raise InputError(f"recipe {recipe} has no stage {name!r}; its stages: {known}")
    return specs[key]


def specs_of(recipe: str) -> list[StageSpec]:
    """The stage specs of a recipe in declaration order (pipeline order, pad stages last)."""
    r = Recipe(recipe)
    return [s for (rr, _), s in all_specs().items() if rr == r]
