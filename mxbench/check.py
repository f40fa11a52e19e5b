"""Correctness of any implementation against the stage's oracle (``mxbench check``; ``roofline --impl`` runs it
before timing an outside implementation).

The step is built padded (so the pad and unpad stages are checked too) over token groups that include an empty
group and sizes that are not multiples of the alignment -- or, with ``pad=False``, unpadded over aligned groups, where
the GEMMs may get fewer rows than experts -- on seeded inputs with adversarial MX blocks planted in
them: all zero, NaN, +-Inf (MXFP8 only: FP8 rowwise requires finite input), values at and past the e4m3 limit,
fp32-subnormal values (scale 2**-127) and blocks mixing huge and tiny values. The oracle of every stage runs first,
in step order, so each stage's inputs are the oracle's outputs of the stages before it; every implementation of a
stage gets those same inputs and its outputs are compared with the oracle's by the spec's rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
from mxkernels import gemm_native
from mxkernels.comparison import MinSQNR, Mismatch
from mxkernels.errors import InputError
from mxkernels.format import BLOCK_SIZE
from mxkernels.names import Recipe
from mxkernels.pipeline import Stage, group_ends, step_stages
from mxkernels.stages import padding_alignment

from .registry import Deviation, Implementation


class Verdict(StrEnum):
    PASS = "PASS"
    DEVIATES = "DEVIATES"  # differs only inside the blocks of the implementation's declared deviation
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckResult:
    """One implementation of one stage against the oracle. ``detail``: the rule and how it held (PASS), the
    mismatch (FAIL), the exception (ERROR) or why the implementation cannot run here (SKIP)."""

    recipe: Recipe
    stage: str
    impl: str
    verdict: Verdict
    detail: str
    mismatch: Mismatch | None = None
    input_text: str | None = None

    def finding(self) -> str:
        """The first mismatch in one line: output, index, input, expected, got."""
        return self.detail if self.mismatch is None else self.mismatch.describe(self.input_text)


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------


def check_group_sizes(M: int, G: int, alignment: int, aligned: bool = False) -> list[int]:
    """Token-group sizes summing to M: group 0 empty (when G > 1) and the others uneven, off the alignment where M
    allows it, so the padding paths are exercised. ``aligned``: every size a multiple of the alignment (M must be
    one), for the step without padding, whose GEMMs see M rows: fewer than the experts where M < G."""
    if aligned and M % alignment:
        raise InputError(f"aligned token groups (--no-pad) need M a multiple of {alignment}, got {M}")
    if G == 1:
        return [M]
    rest = G - 1
    if aligned:
        base, extra = divmod(M // alignment, rest)
        return [0] + [(base + (g < extra)) * alignment for g in range(rest)]
    base, extra = divmod(M, rest)
    sizes = [0] + [base + (g < extra) for g in range(rest)]
    if rest > 1 and sizes[1] > alignment:
        shift = min(alignment // 2 + 1, sizes[2])  # move a few rows from group 2 to group 1: both go off-grid
        sizes[1] += shift
        sizes[2] -= shift
    return sizes


def _plant(x: torch.Tensor, row: int, finite_only: bool) -> None:
    """Adversarial MX blocks (32 elements along the last dim) in rows ``row``.. of the 2D view of ``x``."""
    flat = x.view(-1, x.shape[-1])
    cols = flat.shape[1]
    blocks = [(r, b * BLOCK_SIZE) for r in range(row, min(row + 4, flat.shape[0])) for b in range(cols // BLOCK_SIZE)]
    ramp = torch.linspace(-3.0, 3.0, BLOCK_SIZE)
    specials = [
        torch.zeros(BLOCK_SIZE),  # all zero: zero data, the smallest scale
        torch.linspace(-500.0, 500.0, BLOCK_SIZE),  # past the e4m3 limit: FLOOR saturates to 448
        torch.tensor([448.0, -448.0] * (BLOCK_SIZE // 2)),  # exactly at the limit
        torch.arange(1, BLOCK_SIZE + 1) * 2.0**-133,  # fp32 subnormals: scale 2**-127
        torch.tensor([1e30, 1e-30] * (BLOCK_SIZE // 2)),  # huge and tiny: the tiny ones flush to zero
    ]
    if not finite_only:
        specials += [_with(ramp, 3, float("nan")), _with(ramp, 7, float("inf")), _with(ramp, 0, float("-inf"))]
    for (r, c), block in zip(blocks, specials):
        flat[r, c : c + BLOCK_SIZE] = block.to(flat.dtype).to(flat.device)


def _with(block: torch.Tensor, index: int, value: float) -> torch.Tensor:
    out = block.clone()
    out[index] = value
    return out


def check_inputs(recipe: str, M: int, N: int, K: int, G: int, *, device, seed: int = 0, pad: bool = True):
    """(inputs, group sizes): bf16 a (M, K), w (G, N, K), grad_out (M, N), int32 offs, seeded, with adversarial
    blocks in the first rows of the first non-empty group of a and grad_out and in the first expert's weights.
    Without ``pad`` the groups are aligned (``check_group_sizes``)."""
    sizes = check_group_sizes(M, G, padding_alignment(recipe), aligned=not pad)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    w = (torch.randn(G, N, K, generator=gen) * K**-0.5).to(torch.bfloat16)
    grad_out = (torch.randn(M, N, generator=gen) * 1e-2).to(torch.bfloat16)
    first = next((sum(sizes[:g]) for g, s in enumerate(sizes) if s), 0)
    finite_only = Recipe(recipe) != Recipe.MXFP8
    _plant(a, first, finite_only)
    _plant(grad_out, first, True)  # one source of NaN per step keeps the backward's finite outputs checkable
    _plant(w[0], 0, True)
    inputs = {"a": a.to(device), "w": w.to(device), "grad_out": grad_out.to(device), "offs": group_ends(sizes, device)}
    return inputs, sizes


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------


def _describe(x: torch.Tensor) -> str:
    if x.numel() == 1:
        return repr(x.float().item())
    values = x.float().reshape(-1)
    return f"amax {values.abs().nan_to_num(float('inf')).max().item()!r} over {values.numel()} values"


def _input_text(stage: Stage, mismatch: Mismatch, inputs: Sequence[torch.Tensor]) -> str | None:
    spec = stage.spec
    if mismatch.index is None or spec.locate is None:
        return None
    try:
        position, index = spec.locate(mismatch.output, mismatch.index)
        x = inputs[position]
        where = ", ".join(f"{i.start}:{i.stop}" if isinstance(i, slice) else str(i) for i in index)
        return f"{spec.inputs[position].name}[{where}] = {_describe(x[index])}"
    except (IndexError, TypeError, ValueError):
        return None


def _pass_detail(stage: Stage, got: tuple, expected: tuple, inputs: Sequence[torch.Tensor]) -> str:
    rule = stage.spec.rule
    if not isinstance(rule, MinSQNR):
        return rule.describe()
    worst = min(stage.spec.sqnr(got, expected, inputs))
    return f"SQNR {worst:.1f} dB (>= {rule.floor_db:g})"


def check_stage(stage: Stage, impl: Implementation, inputs: Sequence[torch.Tensor], expected: tuple,
                device: torch.device) -> CheckResult:  # fmt: skip
    """One implementation of ``stage`` on ``inputs`` against the oracle's ``expected`` outputs."""
    result = lambda verdict, detail, **kw: CheckResult(stage.recipe, stage.name, impl.name, verdict, detail, **kw)
    reason = impl.unavailable(device)
    if reason is not None:
        return result(Verdict.SKIP, reason)
    try:
        got = impl.fn(*inputs, **stage.params)
        mismatch = stage.spec.compare(got, expected, inputs)
    except Exception as e:  # noqa: BLE001 -- the implementation under test raised: its row says how
        return result(Verdict.ERROR, f"{type(e).__name__}: {' '.join(str(e).split())}")
    if mismatch is not None and impl.deviation is not None:
        excused = _excuse(impl.deviation, got, expected)
        if excused is not None and stage.spec.compare(excused, expected, inputs) is None:
            return result(Verdict.DEVIATES, f"known deviation ({impl.deviation.name}); elsewhere "
                          f"{_pass_detail(stage, got, expected, inputs)}", mismatch=mismatch,
                          input_text=_input_text(stage, mismatch, inputs))  # fmt: skip
    if mismatch is not None:
        return result(Verdict.FAIL, mismatch.message, mismatch=mismatch,
                      input_text=_input_text(stage, mismatch, inputs))  # fmt: skip
    return result(Verdict.PASS, _pass_detail(stage, got, expected, inputs))


def _excuse(deviation: Deviation, got: tuple, expected: tuple) -> tuple | None:
    """``got`` with the oracle's values put back inside the deviation's blocks, for an MX quantizer's (data,
    scales) pair whose scales run along the data's last dim; None where that does not apply."""
    if len(expected) != 2 or any(not isinstance(g, torch.Tensor) for g in got):
        return None
    (q, s), (eq, es) = got, expected
    if q.shape != eq.shape or s.shape != es.shape or es.dtype.itemsize != 1 or eq.shape[-1] != es.shape[-1] * BLOCK_SIZE:
        return None
    blocks = torch.isin(es.view(torch.uint8), torch.tensor(deviation.scale_bytes, dtype=torch.uint8, device=es.device))
    data = blocks.repeat_interleave(BLOCK_SIZE, dim=-1)
    q = torch.where(data, eq.view(torch.uint8), q.to(eq.device).view(torch.uint8)).view(eq.dtype)
    s = torch.where(blocks, es.view(torch.uint8), s.to(es.device).view(torch.uint8)).view(es.dtype)
    return q, s


def check_step(
    recipe: str,
    M: int,
    N: int,
    K: int,
    G: int,
    impls: Mapping[str, Sequence[Implementation]],
    *,
    mode: str = "rceil",
    device: torch.device | str = "cpu",
    seed: int = 0,
    pad: bool = True,
) -> list[CheckResult]:
    """Every implementation in ``impls`` (stage name -> implementations to check) against the oracle, in step
    order. ``pad``: the step pads token groups off the alignment; without it the groups are aligned and the step
    has no pad or unpad stages."""
    device = torch.device(device)
    stages = step_stages(recipe, M, N, K, G, mode=mode, pad=pad)
    # The fused-scale quantizers run in the fuse_scales step only; checked after the step, on the same inputs.
    names = {s.name for s in stages}
    stages += [s for s in step_stages(recipe, M, N, K, G, mode=mode, pad=pad, fuse_scales=True) if s.name not in names]
    unknown = sorted(set(impls) - {s.name for s in stages})
    if unknown:
        raise InputError(f"recipe {recipe} has no stage {', '.join(unknown)}")
    env, _ = check_inputs(recipe, M, N, K, G, device=device, seed=seed, pad=pad)
    results = []
    for stage in stages:
        inputs = [env[name] for name in stage.inputs]
        expected = stage.spec.oracle(*inputs, **stage.params)
        for impl in impls.get(stage.name, ()):
            results.append(check_stage(stage, impl, inputs, expected, device))
        for name, value in zip(stage.outputs, expected, strict=True):
            if name is not None:
                env[name] = value
    return results


def native_line(recipe: str, device: torch.device | str) -> str:
    """What the native backend decided for ``recipe`` on ``device``, and why: for MXFP8 on SM100 what its probe at
    first use found (the build's kernel image for the card, the known-answer GEMMs) or why it failed."""
    device = torch.device(device)
    found = gemm_native.verdict(recipe, gemm_native.capability(device), device)
    return f"native {recipe} on {device}: {'available' if found.available else 'unavailable'}: {found.reason}"


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 every checked implementation passed; 1 one failed or raised. Nothing checked at all is unusable input."""
    results = list(results)
    if any(r.verdict in (Verdict.FAIL, Verdict.ERROR) for r in results):
        return 1
    if not any(r.verdict == Verdict.PASS for r in results):
        reasons = "; ".join(f"{r.stage}/{r.impl}: {r.detail}" for r in results) or "no implementation selected"
        raise InputError(f"nothing was checked: {reasons}")
    return 0
