"""Expert parallelism as stages: the EP stage specs and the three strategies, each a stage list of one rank.

One MoE expert projection ``y = x @ w_e^T`` with EP degree = world size W and E local experts per rank (global
expert g lives on rank g // E as local expert g % E). A rank holds T tokens x (T, K) routed to top_k distinct
global experts each, its experts' weights w (E, N, K), and returns y (T * top_k, N): row t * top_k + j is token
t through its j-th expert. Per rank, in execution order:

forward   sort the token copies by global expert -> dispatch all-to-all -> permute the received rows from
          [source rank][local expert] to [local expert][source rank] -> (pad groups) -> grouped GEMM -> (unpad) ->
          unpermute -> combine all-to-all -> unsort back to copy order
backward  the mirror for grad_x (the dispatch's gradient sums each token's top_k copies), and the weight gradient
          from the permuted rows and the permuted gradient.

Strategies (declared in ``ep.strategy``), which differ in the GEMMs' recipe and where the tokens are quantized:

* ``bf16``: bf16 all-to-alls and bf16 GEMMs (the recipe ``bf16`` step on the permuted rows);
* ``mxfp8``: bf16 all-to-alls, the recipe ``mxfp8`` step (quantize right before each GEMM): today's usual recipe;
* ``mxfp8_a2a``: x is quantized (1x32 along K) before the dispatch; e4m3 data and e8m0 scales travel through the
  sort, the dispatch and the permute, and feed the forward GEMM with no re-quantization. The combine returns bf16.
  In the backward the combine's gradient is quantized (1x32 along N) before its all-to-all and feeds the dgrad
  GEMM; the dispatch's gradient travels in bf16.
* ``fp8_rowwise``: bf16 all-to-alls, the recipe ``fp8_rowwise`` step (one fp32 scale per row, quantize right before
  each GEMM; our SM90 GEMM where it is the dispatch's default).
* ``fp8_rowwise_a2a``: as mxfp8_a2a with FP8 rowwise rows: x quantized rowwise along K before the dispatch, e4m3
  rows and their fp32 scales (one a row, 4 bytes) travel through the sort, the dispatch, the permute and the pad
  and feed the forward GEMM; the combine's gradient likewise (rowwise along N, the dgrad GEMM's contraction); the
  combine and the dispatch's gradient in bf16 (DeepEP's choice). The recipe's wgrad quantizes each expert's
  columns along the tokens, which rows quantized along their width cannot give: the crossed rows are dequantized
  (q * scale in fp32, rounded to bf16) and quantized again per group (``quantize_*_t``).

The weight gradient's precision is an option of its own (``ep_wgrad.Wgrad``; by default MXFP8 for mxfp8 and a bf16
GEMM of the exactly dequantized rows for mxfp8_a2a, as torchao's EP benchmark runs it), so that mxfp8 and
mxfp8_a2a at the same wgrad differ in the all-to-all precision alone.

The EP specs are ``StageSpec``s like every other stage (contract, oracle, comparison rule, mxkernels' implementation),
declared under the recipe of the data they carry (``bf16``, ``mxfp8`` or ``fp8_rowwise``) in their own table,
``ep_specs()`` (the calls and their oracles are ``ep.rows``'); the all-to-alls' contract takes the host split sizes and
the process group as parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from ..ep import comm
from ..ep import rows as row_calls
from ..ep.strategy import BASELINE, STRATEGIES, get_strategy, row_widths  # noqa: F401 -- the first two re-exported
from ..gemm import grouped_gemm
from ..gemm.backend import GemmCase
from ..layouts import scale_layout, padding
from ..quant import fp8_rowwise, quantize
from ..core.comparison import BitExact
from ..core.cost import Cost
from ..ep.wgrad import Wgrad, resolve_wgrad, wgrad_recipe
from .ep_wgrad import rebind, wgrad_stages
from ..core.format import BLOCK_SIZE
from ..core.names import PASSES, Category, Pass, Recipe
from .pipeline import Stage, bind_stage, check_sizes, needs_padding, step_stages, with_impls
from ..core.runtime import InputError
from .step_specs import Port, StageImpl, StageSpec, get_spec, padding_alignment
from ..moe.token_permute import (
    chunk_transpose_cost,
    gather_rows_cost,
)

A2A_PARAMS = ("send_splits", "recv_splits", "group")


@dataclass(frozen=True)
class EPShape:
    """What one rank's stage list is bound to: the layer's sizes and the routing as known on the host.

    ``send_counts[r][e]``: token copies this rank sends to local expert e of rank r; ``recv_counts[s][e]``: copies
    rank s sends this rank for its local expert e (both W x E).
    """

    T: int
    K: int
    N: int
    E: int
    top_k: int
    rank: int
    world: int
    send_counts: tuple[tuple[int, ...], ...]
    recv_counts: tuple[tuple[int, ...], ...]

    @property
    def S(self) -> int:
        """Token copies this rank sends (T * top_k)."""
        return self.T * self.top_k

    @property
    def send_splits(self) -> list[int]:
        return [sum(row) for row in self.send_counts]

    @property
    def recv_splits(self) -> list[int]:
        return [sum(row) for row in self.recv_counts]

    @property
    def R(self) -> int:
        """Rows this rank receives: the M of its grouped GEMMs."""
        return sum(self.recv_splits)

    @property
    def group_sizes(self) -> list[int]:
        """Received rows per local expert."""
        return [sum(row[e] for row in self.recv_counts) for e in range(self.E)]


def check_layer(T: int, K: int, N: int, E: int, top_k: int, world: int) -> None:
    """Raise ``InputError`` naming the bad size (before any process group work)."""
    check_sizes({"tokens": T, "K": K, "N": N}, ("experts (local experts per rank)", E))
    if not 1 <= top_k <= E * world:
        raise InputError(f"top-k must be between 1 and the {E * world} experts of all ranks, got {top_k}")


def check_strategy(strategy: str) -> str:
    return get_strategy(strategy).name


# ---------------------------------------------------------------------------------------------------------------
# The declarations
# ---------------------------------------------------------------------------------------------------------------

_COUNTS = Port("counts", "int32 (W, E) on the device: rows source rank s sent for local expert e")
_ENDS = Port("offs", "int32 (E,) group ends of the expert-major rows")
_TOKEN_OF = Port("token_of", "int32 (T*k,): the token of each copy, copies sorted by global expert")
_ORDER = Port("order", "int32 (T*k,): the copies sorted by global expert (copy c = token * k + choice)")
_POS = Port("pos", "int32 (T*k,): where each copy stands in the sorted order")
_GROUPS = Port("offs", "int32 (E,) group ends")


def _payload(recipe: Recipe, name: str, rows: str, width: str) -> tuple[Port, ...]:
    if recipe == Recipe.MXFP8:
        return (Port(f"{name}_q", f"float8_e4m3fn ({rows}, {width})"),
                Port(f"{name}_s", f"float8_e8m0fnu ({rows}, {width}/32) scales, row-major"))  # fmt: skip
    if recipe == Recipe.FP8_ROWWISE:
        return (Port(f"{name}_q", f"float8_e4m3fn ({rows}, {width})"),
                Port(f"{name}_s", f"float32 ({rows},) one scale per row"))  # fmt: skip
    return (Port(name, f"bf16 ({rows}, {width})"),)


def _move(recipe, name, pass_, category, purpose, src, dst, rows, width, index, oracle, impl, kernel, params=(),
          extra_out=()) -> StageSpec:  # fmt: skip
    ins = (*_payload(recipe, src, rows[0], width), *index)
    outs = (*_payload(recipe, dst, rows[1], width), *extra_out)
    return StageSpec(recipe, name, pass_, category, purpose, ins, outs, oracle, BitExact(), impl, kernel, params)


def _moves(recipe: Recipe) -> list[StageSpec]:
    """The row movements of one payload kind (bf16 rows, or MXFP8 data rows with their scale rows)."""
    F, DI, P, A = Pass.FORWARD, Pass.BACKWARD_INPUT, Category.PERMUTE, Category.ALL_TO_ALL
    sort = (row_calls.gather_reference, row_calls.gather, "gather_rows")
    a2a = (comm.all_to_all_rows_reference, comm.all_to_all_rows, "torch.distributed.all_to_all_single")
    permute = (row_calls.permute_reference, row_calls.permute, "chunk_transpose_index + gather_rows")
    unpermute = (row_calls.unpermute_reference, row_calls.unpermute, "chunk_transpose_index + gather_rows")
    # name, pass, category, purpose, src, dst, (rows in, rows out), width, index ports, calls, params, extra outputs
    table = [
        ("sort_tokens", F, P, "Sort token copies by global expert", "x", "xs", ("T", "T*k"), "K", (_TOKEN_OF,), sort),
        ("dispatch", F, A, "Dispatch all-to-all: token copies to their experts' ranks", "xs", "xr", ("T*k", "R"), "K",
         (), a2a, A2A_PARAMS),
        ("permute", F, P, "Permute received rows to expert-major order", "xr", "a", ("R", "R"), "K", (_COUNTS,),
         permute, (), (_ENDS,)),
        ("unpermute", F, P, "Unpermute the output to source-rank-major order", "out", "outr", ("R", "R"), "N",
         (_COUNTS,), unpermute),
        ("combine", F, A, "Combine all-to-all: outputs back to their tokens' ranks", "outr", "ys", ("R", "T*k"), "N",
         (), a2a, A2A_PARAMS),
        ("unsort_tokens", F, P, "Unsort the output to copy order", "ys", "y", ("T*k", "T*k"), "N", (_POS,), sort),
        ("sort_grad", DI, P, "Sort grad_out by global expert", "dy", "dys", ("T*k", "T*k"), "N", (_ORDER,), sort),
        ("combine_grad", DI, A, "Combine's gradient all-to-all (to the experts' ranks)", "dys", "dyr", ("T*k", "R"),
         "N", (), a2a, A2A_PARAMS),
        ("permute_grad", DI, P, "Permute received grad_out rows to expert-major order", "dyr", "grad_out",
         ("R", "R"), "N", (_COUNTS,), permute, (), (_ENDS,)),
        ("unpermute_grad", DI, P, "Unpermute grad_a to source-rank-major order", "grad_a", "grad_ar", ("R", "R"), "K",
         (_COUNTS,), unpermute),
        ("dispatch_grad", DI, A, "Dispatch's gradient all-to-all (back to the tokens' ranks)", "grad_ar", "grad_xs",
         ("R", "T*k"), "K", (), a2a, A2A_PARAMS),
        ("unsort_grad", DI, P, "Sum each token's top_k gradient copies (fp32, rounded once)", "grad_xs", "grad_x",
         ("T*k", "T"), "K", (_POS,), sort, ("top_k",)),
    ]  # fmt: skip
    # Quantized rows move only where the *_a2a strategies carry them: the dispatch side forward, the combine side
    # backward.
    mx_moves = {"sort_tokens", "dispatch", "permute", "sort_grad", "combine_grad", "permute_grad"}
    specs = []
    for name, pass_, cat, purpose, src, dst, rows, width, index, (oracle, impl, kernel), *rest in table:
        if recipe != Recipe.BF16 and name not in mx_moves:
            continue
        params, extra_out = (rest + [(), ()])[:2]
        specs.append(_move(recipe, name, pass_, cat, purpose, src, dst, rows, width, index, oracle, impl, kernel,
                           params, extra_out))  # fmt: skip
    return specs


def _quantized_pads(R: Recipe, suffix: str, what: str) -> list[StageSpec]:
    """Padding a quantized payload's rows with their scale rows (``pad_a_<suffix>``, ``pad_grad_out_<suffix>``)."""
    F, DI = Pass.FORWARD, Pass.BACKWARD_INPUT
    return [StageSpec(
        R, f"pad_{src}_{suffix}", pass_, Category.PAD, f"Pad {what} {src} token groups (data and scales) to the alignment",
        (*_payload(R, src, "R", width), _GROUPS), (*_payload(R, f"{src}_p", "padded", width),
                                                   Port("offs_p", "int32 (E,) slot ends")),
        row_calls.pad_pair_reference, BitExact(), row_calls.pad_pair, "pad_token_groups (data, scales)", params=("alignment",),
    ) for pass_, src, width in ((F, "a", "K"), (DI, "grad_out", "N"))]  # fmt: skip


def _mx_extras() -> list[StageSpec]:
    """mxfp8_a2a's own stages: padding MXFP8 rows with their scales, and the exact dequantization for its wgrad."""
    R, DW = Recipe.MXFP8, Pass.BACKWARD_WEIGHT
    specs = _quantized_pads(R, "mx", "MXFP8")
    for name, src in (("dequantize_a", "a"), ("dequantize_grad_out", "grad_out")):
        specs.append(StageSpec(
            R, name, DW, Category.QUANTIZE, f"Dequantize MXFP8 {src} to bf16 (exact) for the bf16 wgrad",
            (Port(f"{src}_q", "float8_e4m3fn (M, D)"), Port(f"{src}_sb", "float8_e8m0fnu m-groups blocked scales"),
             _GROUPS), (Port(src, "bf16 (M, D); rows past offs[-1] zero"),),
            row_calls.dequantize_mx_reference, BitExact(), row_calls.dequantize_mx, "dequantize_blocked(layout=m_groups)",
        ))  # fmt: skip
    return specs


def _fp8_extras() -> list[StageSpec]:
    """fp8_rowwise_a2a's own stages: padding FP8 rows with their scale rows, and the dequantization its wgrad needs
    (the recipe's wgrad quantizes along the tokens; the rows crossed quantized along their width)."""
    R, DW = Recipe.FP8_ROWWISE, Pass.BACKWARD_WEIGHT
    specs = _quantized_pads(R, "fp8", "FP8 rowwise")
    for name, src in (("dequantize_a", "a"), ("dequantize_grad_out", "grad_out")):
        specs.append(StageSpec(
            R, name, DW, Category.QUANTIZE, f"Dequantize FP8 rowwise {src} to bf16 for the wgrad's quantizers",
            (Port(f"{src}_q", "float8_e4m3fn (M, D)"), Port(f"{src}_s", "float32 (M,) row scales")),
            (Port(src, "bf16 (M, D): fp32(q * scale) rounded to bf16"),),
            row_calls.dequantize_fp8_reference, BitExact(), row_calls.dequantize_fp8, "q.float() * scale -> bf16",
        ))  # fmt: skip
    return specs


@functools.cache
def ep_specs() -> dict[tuple[Recipe, str], StageSpec]:
    """Every EP stage spec by (recipe, name): bf16 row movements, MXFP8 row movements, and mxfp8_a2a's own stages.

    Kept apart from ``stages.all_specs()``, the single-GPU step's table, which ``mxbench check`` and the registry run
    one recipe at a time outside any process group."""
    return {s.key: s for s in (*_moves(Recipe.BF16), *_moves(Recipe.MXFP8), *_mx_extras(), *_moves(Recipe.FP8_ROWWISE),
                               *_fp8_extras())}


def get_ep_spec(recipe: str, name: str) -> StageSpec:
    """The spec of a stage an EP step runs: an EP spec, else the single-GPU step's (``stages.get_spec``)."""
    return ep_specs().get((Recipe(recipe), name)) or get_spec(recipe, name)


# ---------------------------------------------------------------------------------------------------------------
# The strategies
# ---------------------------------------------------------------------------------------------------------------


class _Builder:
    """Stages of one rank's step, bound to its shape: movement stages know their costs from the shape."""

    def __init__(self, shape: EPShape, group, mode: str, backend: str | None, wgrad: Recipe = Recipe.BF16):
        self.s, self.group, self.mode, self.backend, self.wgrad = shape, group, mode, backend, wgrad
        self.stages: list[Stage] = []

    def add(self, recipe, name, shapes, cost, inputs, outputs, params=None, backend=None) -> None:
        self.stages.append(bind_stage(get_ep_spec(recipe, name), shapes, cost, inputs, outputs, params, backend))

    def gather(self, recipe, name, rows_in, rows_out, width, index, src, dst, top_k=1) -> None:
        # the rows_in source rows are read from DRAM once however many copies gather them (sort_tokens: T token
        # rows into T * top_k copies); the other reads are ``Cost.bytes_reread``
        widths = _widths(recipe, width)
        cost = sum((gather_rows_cost(rows_out, w, e, top_k, sources=rows_in) for w, e in widths), Cost(0, 0))
        params = {"top_k": top_k} if top_k > 1 else None
        self.add(recipe, name, [(rows_in, width)], cost, (*src, index), dst, params)

    def a2a(self, recipe, name, width, src, dst, forward: bool) -> None:
        s = self.s
        send, recv = (s.send_splits, s.recv_splits) if forward else (s.recv_splits, s.send_splits)
        row_bytes = sum(w * e for w, e in _widths(recipe, width))
        params = {"send_splits": tuple(send), "recv_splits": tuple(recv), "group": self.group}
        self.add(recipe, name, [(sum(send), width)], comm.all_to_all_cost(send, recv, s.rank, row_bytes), src, dst,
                 params)  # fmt: skip

    def permute(self, recipe, name, width, src, dst) -> None:
        s, chunks = self.s, self.s.world * self.s.E
        widths = _widths(recipe, width)
        cost = chunk_transpose_cost(s.R, widths[0][0], widths[0][1], chunks)
        cost = sum((gather_rows_cost(s.R, w, e) for w, e in widths[1:]), cost)
        self.add(recipe, name, [(s.R, width)], cost, (*src, "counts"), dst)


def _widths(recipe: Recipe, width: int) -> list[tuple[int, int]]:
    """(columns, bytes per element) of each tensor of a row payload (``strategy.row_widths``)."""
    return row_widths(recipe, width)


def _split_passes(stages: Sequence[Stage]) -> dict[Pass, list[Stage]]:
    return {p: [s for s in stages if s.pass_name == p] for p in PASSES}


def _recipe_strategy(b: _Builder, recipe: Recipe) -> None:
    """bf16 / mxfp8: bf16 rows everywhere, the recipe's own step on the permuted rows."""
    s, BF = b.s, Recipe.BF16
    pad = needs_padding(recipe, s.group_sizes)
    expert = _split_passes(step_stages(recipe, s.R, s.N, s.K, s.E, mode=b.mode,
                                       backend=None if recipe == Recipe.BF16 else b.backend, pad=pad))  # fmt: skip
    if recipe == Recipe.BF16:  # torch._grouped_mm has no backend choice: name it in the records, as pipeline does
        expert = {p: [replace(st, backend="bf16") if st.category == Category.GEMM else st for st in stages]
                  for p, stages in expert.items()}  # fmt: skip
    b.gather(BF, "sort_tokens", s.T, s.S, s.K, "token_of", ("x",), ("xs",))
    b.a2a(BF, "dispatch", s.K, ("xs",), ("xr",), forward=True)
    b.permute(BF, "permute", s.K, ("xr",), ("a", "offs"))
    b.stages += expert[Pass.FORWARD]
    _combine_side_forward(b)
    b.gather(BF, "sort_grad", s.S, s.S, s.N, "order", ("dy",), ("dys",))
    b.a2a(BF, "combine_grad", s.N, ("dys",), ("dyr",), forward=True)
    b.permute(BF, "permute_grad", s.N, ("dyr",), ("grad_out", "offs"))
    b.stages += expert[Pass.BACKWARD_INPUT]
    _dispatch_side_backward(b)
    if b.wgrad == recipe:
        b.stages += expert[Pass.BACKWARD_WEIGHT]
    else:  # the other precision's wgrad on the same (padded) rows
        Rp = padding.padded_rows(s.R, s.E, padding_alignment(recipe)) if pad else s.R
        names = {"grad_out": "dy_p", "a": "a_p", "offs": "offs_p"} if pad else {}
        b.stages += rebind(wgrad_stages(b.wgrad, Rp, s.N, s.K, s.E, mode=b.mode, backend=b.backend), names)


def _combine_side_forward(b: _Builder) -> None:
    s, BF = b.s, Recipe.BF16
    b.permute(BF, "unpermute", s.N, ("out",), ("outr",))
    b.a2a(BF, "combine", s.N, ("outr",), ("ys",), forward=False)
    b.gather(BF, "unsort_tokens", s.S, s.S, s.N, "pos", ("ys",), ("y",))


def _dispatch_side_backward(b: _Builder) -> None:
    s, BF = b.s, Recipe.BF16
    b.permute(BF, "unpermute_grad", s.K, ("grad_a",), ("grad_ar",))
    b.a2a(BF, "dispatch_grad", s.K, ("grad_ar",), ("grad_xs",), forward=False)
    b.gather(BF, "unsort_grad", s.S, s.T, s.K, "pos", ("grad_xs",), ("grad_x",), top_k=s.top_k)


@dataclass(frozen=True)
class _MxPass:
    """One MXFP8 path of mxfp8_a2a, from the bf16 rows where they are made to the GEMM on the expert's rank:
    quantize ``src`` (``rows`` x ``width``), sort by expert (``sort`` with ``index``), all-to-all (``a2a``),
    permute to ``act``, pad, rearrange its scales, and the GEMM against weights quantized along ``width``."""

    quantize: str
    src: str
    rows: int
    width: int
    sort: str
    index: str
    a2a: str
    permute: str
    act: str
    pad: str
    rearrange: str
    quantize_w: str
    w: str
    rearrange_w: str
    w_rows: int  # the weights' rows in the GEMM's layout (G, w_rows, width)
    gemm: str
    out: str
    unpad: str


def _quantize_costs(recipe: Recipe, rows: int, width: int, s: EPShape, along: str) -> tuple[Cost, Cost]:
    """(the rows' quantizer, the weights' quantizer along ``along``) of a quantized payload's recipe."""
    bf16 = torch.bfloat16
    if recipe == Recipe.MXFP8:
        return quantize.quantize_2d_cost(rows, width, bf16), quantize.quantize_3d_cost(s.E, s.N, s.K, bf16)
    return (fp8_rowwise.quantize_fp8_rowwise_cost(rows, width, bf16),
            fp8_rowwise.quantize_fp8_rowwise_3d_cost(s.E, s.N, s.K, bf16, along))  # fmt: skip


def _mx_pass(b: _Builder, mp: _MxPass, pad: bool, recipe: Recipe = Recipe.MXFP8) -> None:
    """One quantized path of an *_a2a strategy in ``recipe``: MXFP8 (its scales rearranged into the GEMM's blocked
    layout after the pad) or FP8 rowwise (one fp32 scale a row, which the GEMM reads as it travelled)."""
    s, mx = b.s, recipe == Recipe.MXFP8
    align, width, blocks = padding_alignment(recipe), mp.width, mp.width // BLOCK_SIZE
    md = {"mode": b.mode} if mx else None
    R, Rp = s.R, padding.padded_rows(s.R, s.E, align) if pad else s.R
    p, offs = ("_p", "offs_p") if pad else ("", "offs")
    q = lambda name: (f"{name}_q", f"{name}_s")  # data and scale names of one quantized tensor
    q_cost, w_cost = _quantize_costs(recipe, mp.rows, width, s, "K" if mp.w == "w" else "N")
    b.add(recipe, mp.quantize, [(mp.rows, width)], q_cost, (mp.src,), q(mp.src), md)
    b.gather(recipe, mp.sort, s.T if mp.index == "token_of" else s.S, s.S, width, mp.index, q(mp.src), q(mp.src + "s"))
    b.a2a(recipe, mp.a2a, width, q(mp.src + "s"), q(mp.src + "r"), forward=True)
    b.permute(recipe, mp.permute, width, q(mp.src + "r"), (*q(mp.act), "offs"))
    if pad:
        cost = sum((padding.pad_cost(R, w, s.E, align, e) for w, e in _widths(recipe, width)), Cost(0, 0))
        b.add(recipe, mp.pad, [(R, w) for w, _ in _widths(recipe, width)], cost, (*q(mp.act), "offs"),
              (f"{mp.act}_q_p", f"{mp.act}_s_p", "offs_p"), {"alignment": align})  # fmt: skip
    scales = f"{mp.act}_s{p}"
    if mx:
        b.add(recipe, mp.rearrange, [(Rp, blocks)], scale_layout.rearrange_m_groups_cost(Rp, blocks, s.E),
              (scales, offs), (f"{mp.act}_sb",))  # fmt: skip
        scales = f"{mp.act}_sb"
    b.add(recipe, mp.quantize_w, [(s.E, s.N, s.K)], w_cost, ("w",), q(mp.w), md)
    w_scales = f"{mp.w}_s"
    if mx:
        b.add(recipe, mp.rearrange_w, [(s.E, mp.w_rows, blocks)], scale_layout.rearrange_3d_cost(s.E, mp.w_rows, blocks),
              (f"{mp.w}_s",), (f"{mp.w}_sb",))  # fmt: skip
        w_scales = f"{mp.w}_sb"
    b.add(recipe, mp.gemm, [(Rp, width), (s.E, width, mp.w_rows)],
          grouped_gemm.grouped_mm_cost(Rp, mp.w_rows, width, s.E, recipe, GemmCase.A2D_B3D),
          (f"{mp.act}_q{p}", scales, f"{mp.w}_q", w_scales, offs), (f"{mp.out}{p}",), backend=b.backend)  # fmt: skip
    if pad:
        b.add(recipe, mp.unpad, [(Rp, mp.w_rows)], padding.unpad_cost(R, mp.w_rows, s.E, align, 2),
              (f"{mp.out}_p", "offs", "offs_p"), (mp.out,), {"num_tokens": R})  # fmt: skip


def _a2a_strategy(b: _Builder, recipe: Recipe) -> None:
    """Quantized rows (``recipe``: MXFP8 or FP8 rowwise) through sort, dispatch and permute, and the mirror of the
    combine in the backward; the wgrad on the dequantized rows."""
    s, mx = b.s, recipe == Recipe.MXFP8
    pad = needs_padding(recipe, s.group_sizes)
    Rp = padding.padded_rows(s.R, s.E, padding_alignment(recipe)) if pad else s.R
    p, offs = ("_p", "offs_p") if pad else ("", "offs")
    pad_a, pad_g = ("pad_a_mx", "pad_grad_out_mx") if mx else ("pad_a_fp8", "pad_grad_out_fp8")
    _mx_pass(b, _MxPass("quantize_a", "x", s.T, s.K, "sort_tokens", "token_of", "dispatch", "permute", "a",
                        pad_a, "rearrange_a", "quantize_w", "w", "rearrange_w", s.N, "gemm_fwd", "out",
                        "unpad_out"), pad, recipe)  # fmt: skip
    _combine_side_forward(b)
    _mx_pass(b, _MxPass("quantize_grad_out", "dy", s.S, s.N, "sort_grad", "order", "combine_grad", "permute_grad",
                        "grad_out", pad_g, "rearrange_grad_out", "quantize_w_t", "wt", "rearrange_w_t",
                        s.K, "gemm_dgrad", "grad_a", "unpad_grad_a"), pad, recipe)  # fmt: skip
    _dispatch_side_backward(b)
    for name, src, width in (("dequantize_grad_out", "grad_out", s.N), ("dequantize_a", "a", s.K)):
        if mx:
            b.add(recipe, name, [(Rp, width)], dequantize_cost(Rp, width, s.E), (f"{src}_q{p}", f"{src}_sb", offs),
                  (f"{src}_bf",))  # fmt: skip
        else:
            b.add(recipe, name, [(Rp, width)], Cost(Rp * (width + 4), 2 * Rp * width), (f"{src}_q{p}", f"{src}_s{p}"),
                  (f"{src}_bf",))  # fmt: skip
    # Wgrad.RECIPE quantizes the dequantized rows again along the tokens (``ep_wgrad``)
    wgrad = wgrad_stages(b.wgrad, Rp, s.N, s.K, s.E, mode=b.mode, backend=b.backend)
    b.stages += rebind(wgrad, {"grad_out": "grad_out_bf", "a": "a_bf", "offs": offs})


def dequantize_cost(rows: int, width: int, E: int) -> Cost:
    """Read the e4m3 rows and their m-groups blocked scales, write bf16 rows."""
    r, c = scale_layout.m_groups_shape(rows, width // BLOCK_SIZE, E)
    return Cost(rows * width + r * c, 2 * rows * width)


def ep_step_stages(
    strategy: str,
    shape: EPShape,
    *,
    group=None,
    mode: str = "rceil",
    backend: str | None = None,
    impls: Mapping[str, StageImpl] | None = None,
    wgrad: Wgrad | None = None,
) -> list[Stage]:
    """Every stage of one rank's EP step (forward, backward_input, backward_weight), in execution order.

    The step's environment starts with x (T, K) bf16, w (E, N, K) bf16, the routing tensors ``token_of``,
    ``order``, ``pos`` and ``counts`` (``ep.RoutingPlan``) and, for the backward, dy (T*k, N); it ends with y,
    grad_x and grad_w. ``backend``: the quantized GEMMs' (None: the device's default for the recipe). ``impls``: stage name ->
    implementation to run instead of mxkernels' (``pipeline.with_impls``). ``wgrad``: the weight gradient's
    precision (``ep_wgrad``; None: the strategy's default).
    """
    decl = get_strategy(strategy)
    wgrad = resolve_wgrad(strategy, wgrad)
    check_layer(shape.T, shape.K, shape.N, shape.E, shape.top_k, shape.world)
    if shape.R == 0:
        raise InputError(f"rank {shape.rank} receives no token copies with this routing: use more tokens per rank")
    if decl.recipe != Recipe.BF16 and backend is None:
        backend = grouped_gemm.default_backend(decl.recipe)
    b = _Builder(shape, group, mode, backend, wgrad_recipe(strategy, wgrad))
    if decl.quantized_a2a:
        _a2a_strategy(b, decl.recipe)
    else:
        _recipe_strategy(b, decl.recipe)
    names = [st.name for st in b.stages]
    assert len(names) == len(set(names)), f"stage names repeat in {strategy}: {names}"
    return with_impls(b.stages, impls)
