"""Correctness of any implementation against the stage's oracle (``mxbench check``; ``roofline --impl`` runs it
before timing an outside implementation).

The step is built padded (so the pad and unpad stages are checked too) on the inputs of ``check_inputs``: token
groups with an empty one and sizes off the alignment, and adversarial MX blocks planted along every dim a quantizer
blocks along, at each ``Scenario`` (the requested M and G, and fewer tokens than experts) and each scale mode asked
for -- or, with ``pad=False`` (``--no-pad``), unpadded over aligned groups, where the GEMMs may get fewer rows than
experts. The oracle of every stage runs first, in step order, so each stage's inputs are the oracle's outputs of the
stages before it; every implementation of a stage gets copies of those inputs (``guarded.call``: its exceptions,
exits, hangs and writes to its inputs are its ERROR row, never the run's end) and every output that differs from the
oracle's by the spec's rule is reported.

``check_stages`` is the generic walk over any list of ``pipeline.Stage`` (any table of ``StageSpec``s): a new
pipeline is checked by building its stages and its input tensors and calling it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
from mxkernels.core.comparison import MinSQNR, Mismatch
from mxkernels.core.errors import InputError
from mxkernels.core.format import BLOCK_SIZE
from mxkernels.core.names import Recipe
from mxkernels.gemm import native as gemm_native
from mxkernels.stages.pipeline import Stage, step_stages
from mxkernels.stages.step_specs import padding_alignment

from ..instruments import guarded
from .apart import picklable, run_apart
from .check_inputs import Scenario, check_group_sizes, check_inputs, scenarios
from .registry import Deviation, Implementation

__all__ = ["CheckResult", "Scenario", "Verdict", "check_group_sizes", "check_inputs", "check_stage", "check_stages",
           "check_step", "exit_code", "json_report", "judge", "merged", "native_line", "scenarios",
           "stages_checked"]  # fmt: skip


class Verdict(StrEnum):
    PASS = "PASS"
    DEVIATES = "DEVIATES"  # differs only inside the blocks of the implementation's declared deviation
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"


WORST_FIRST = (Verdict.ERROR, Verdict.FAIL, Verdict.DEVIATES, Verdict.PASS, Verdict.SKIP)
"""How results of one implementation at several scenarios and modes merge into one row: the worst verdict."""


@dataclass(frozen=True)
class CheckResult:
    """One implementation of one stage against the oracle. ``detail``: the rule and how it held (PASS), the
    mismatches (FAIL), the exception in one line (ERROR) or why the implementation cannot run here (SKIP);
    ``mismatches``: every output that differs, with the input there where it is known (``input_texts``);
    ``trace``: an ERROR's full traceback; ``where``: the scale mode and scenario it was found at."""

    recipe: Recipe
    stage: str
    impl: str
    verdict: Verdict
    detail: str
    mismatches: tuple[Mismatch, ...] = ()
    input_texts: tuple[str | None, ...] = ()
    trace: str = ""
    where: str = ""
    parts: tuple[CheckResult, ...] = ()
    """The results a ``merged`` row stands for (its findings are theirs)."""

    @property
    def mismatch(self) -> Mismatch | None:
        return self.mismatches[0] if self.mismatches else None

    def findings(self) -> list[str]:
        """One line per differing output (output, index, input, expected, got), each saying where it was found;
        the detail when none differs (an error raised alike at several scenarios: once)."""
        if self.parts and not self.mismatches and len({p.detail for p in self.parts}) == 1:
            return self.parts[0].findings()
        if self.parts:
            return [line for part in self.parts for line in part.findings()]
        lines = [m.describe(t) for m, t in zip(self.mismatches, self.input_texts, strict=True)] or [self.detail]
        return [f"[{self.where}] {line}" if self.where else line for line in lines]

    def finding(self) -> str:
        return "; ".join(self.findings())

    def as_dict(self) -> dict:
        return {"recipe": str(self.recipe), "stage": self.stage, "implementation": self.impl,
                "verdict": str(self.verdict), "detail": self.detail, "where": self.where,
                "findings": [m.describe(t) for m, t in zip(self.mismatches, self.input_texts, strict=True)],
                "traceback": self.trace or None}  # fmt: skip


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
                device: torch.device, *, timeout_s: float = guarded.DEFAULT_TIMEOUT_S,
                where: str = "") -> CheckResult:  # fmt: skip
    """One implementation of ``stage`` on copies of ``inputs`` against the oracle's ``expected`` outputs."""

    def result(verdict, detail, **kw):
        return CheckResult(stage.recipe, stage.name, impl.name, verdict, detail, where=where, **kw)

    reason = impl.unavailable(device)
    if reason is not None:
        return result(Verdict.SKIP, reason)
    given = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    # Outside code runs in a thread of its own (a hang is its ERROR row); ours and torch.compile of our references
    # run in this thread, as they do when timed.
    timeout_s = None if impl.origin == "builtin" else timeout_s
    ran = guarded.call(lambda: impl.fn(*given, **stage.params), timeout_s, device)
    if ran.error is not None:
        return result(Verdict.ERROR, ran.error, trace=ran.trace)
    wrote = guarded.mutated(inputs, given, stage.inputs)
    if wrote is not None:
        return result(Verdict.ERROR, wrote)
    got = ran.value
    # Comparing touches what the implementation returned (a tensor subclass, a lazy view): guarded as well.
    compared = guarded.call(lambda: judge(stage, impl.deviation, got, expected, inputs), timeout_s, device)
    if compared.error is not None:
        return result(Verdict.ERROR, f"its outputs could not be compared: {compared.error}", trace=compared.trace)
    verdict, detail, mismatches = compared.value
    texts = tuple(_input_text(stage, m, inputs) for m in mismatches)
    return result(verdict, detail, mismatches=mismatches, input_texts=texts)


def judge(stage: Stage, deviation: Deviation | None, got: tuple, expected: tuple,
          inputs: Sequence[torch.Tensor]) -> tuple[Verdict, str, tuple[Mismatch, ...]]:  # fmt: skip
    """(verdict, detail, mismatches) of outputs ``got`` against the oracle's ``expected`` on ``inputs``, by the
    stage's rule: PASS, DEVIATES (differing only inside the blocks of the declared ``deviation``) or FAIL. What
    ``check`` reports, and what timing holds the outputs of a stage's last timed call to."""
    mismatches = tuple(stage.spec.mismatches(got, expected, inputs))
    if not mismatches:
        return Verdict.PASS, _pass_detail(stage, got, expected, inputs), ()
    if deviation is not None:
        excused = _excuse(deviation, got, expected)
        if excused is not None and not stage.spec.mismatches(excused, expected, inputs):
            detail = f"known deviation ({deviation.name}); elsewhere {_pass_detail(stage, got, expected, inputs)}"
            return Verdict.DEVIATES, detail, mismatches
    return Verdict.FAIL, "; ".join(m.describe() for m in mismatches), mismatches


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


def check_stages(stages: Sequence[Stage], env: Mapping[str, torch.Tensor],
                 impls: Mapping[tuple[Recipe, str], Sequence[Implementation]], *, device: torch.device | str = "cpu",
                 timeout_s: float = guarded.DEFAULT_TIMEOUT_S, where: str = "") -> list[CheckResult]:  # fmt: skip
    """Every implementation in ``impls`` ((recipe, stage name) -> implementations) of the ``stages`` (in order,
    each bound to the names of its inputs and outputs) against the oracle, on the tensors of ``env`` (name ->
    tensor: the inputs of the first stages; each oracle's outputs are added for the stages after it)."""
    device, env, results = torch.device(device), dict(env), []
    checked = [i for i, stage in enumerate(stages) if impls.get(stage.spec.key)]
    for stage in stages[: checked[-1] + 1 if checked else 0]:  # the oracles after the last checked stage: unused
        inputs = [env[name] for name in stage.inputs]
        expected = stage.spec.oracle(*inputs, **stage.params)
        for impl in impls.get(stage.spec.key, ()):
            results.append(check_stage(stage, impl, inputs, expected, device, timeout_s=timeout_s, where=where))
        env.update({name: value for name, value in zip(stage.outputs, expected, strict=True) if name is not None})
    return results


def step_to_check(recipe: str, M: int, N: int, K: int, G: int, mode: str, pad: bool = True) -> list[Stage]:
    """The step's stages (padded, or without padding: no pad or unpad stages), then the fused-scale quantizers of
    the fuse_scales step (they run there only; they are checked after the step, on the same inputs)."""
    stages = step_stages(recipe, M, N, K, G, mode=mode, pad=pad)
    names = {s.name for s in stages}
    fused = step_stages(recipe, M, N, K, G, mode=mode, pad=pad, fuse_scales=True)
    return stages + [s for s in fused if s.name not in names]


def stages_checked(recipe: str, M: int, N: int, K: int, G: int, pad: bool = True) -> set[str]:
    """The names of the stages ``check_step`` checks. Without ``pad`` M must be a multiple of the alignment (the
    groups are aligned): said here, in ``--no-pad``'s terms, before the step's own shape check would."""
    if not pad:
        check_group_sizes(M, G, padding_alignment(recipe), aligned=True)
    return {s.name for s in step_to_check(recipe, M, N, K, G, "rceil", pad)}


def check_step(
    recipe: str,
    M: int,
    N: int,
    K: int,
    G: int,
    impls: Mapping[str, Sequence[Implementation]],
    *,
    mode: str = "rceil",
    modes: Sequence[str] | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    timeout_s: float = guarded.DEFAULT_TIMEOUT_S,
    pad: bool = True,
) -> list[CheckResult]:
    """Every implementation in ``impls`` (stage name -> implementations to check) against the oracle, in step
    order, at each scale mode of ``modes`` (default ``[mode]``) and each ``scenarios(M, G, pad)``: one result per
    (mode, scenario, stage, implementation), ``where`` saying which (``merged`` makes one row of them). ``pad``:
    the step pads token groups off the alignment; without it the groups are aligned and the step has no pad or
    unpad stages (an implementation of one is refused as for a stage the recipe lacks).

    mxkernels' own implementations (and the other built-in ones) run in this process, as they are timed. Every
    outside one (``--impl module:function``, an entry point, one registered through the API) runs in a child
    process of its own (``apart``), on the same inputs made again there from the same seed: a crash, an exit, a
    signal, a hang past ``timeout_s`` or a CUDA context it breaks is its ERROR row, and this process goes on.
    One that cannot be handed to a child (a lambda, a closure) is checked here, in a thread (``guarded``)."""
    modes = list(modes or [mode])
    unknown = sorted(set(impls) - stages_checked(recipe, M, N, K, G, pad))
    if unknown:
        where = "" if pad else " in the step without padding (--no-pad)"
        raise InputError(f"recipe {recipe} has no stage {', '.join(unknown)}{where}")
    apart = [(stage, i) for stage, found in impls.items() for i in found
             if i.origin != "builtin" and picklable(i) is None]  # fmt: skip
    here = {stage: [i for i in found if (stage, i) not in apart] for stage, found in impls.items()}
    job = (recipe, M, N, K, G, modes, str(torch.device(device)), seed, pad)
    results = list(_check_here(*job, here, timeout_s))
    wheres = [f"{m}, {scenario.label()}" for m in modes for scenario in scenarios(M, G, pad, padding_alignment(recipe))]
    for stage, impl in apart:
        results += checked_apart(_check_in_child, (*job, stage, impl), Recipe(recipe), stage, impl, timeout_s,
                                 lambda done: wheres[min(done, len(wheres) - 1)])  # fmt: skip
    order = [s.name for s in step_to_check(recipe, M, N, K, G, modes[0], pad)]
    names = {(stage, i.name): n for stage, found in impls.items() for n, i in enumerate(found)}
    return sorted(results, key=lambda r: (wheres.index(r.where), order.index(r.stage), names[r.stage, r.impl]))


def _check_here(recipe: str, M: int, N: int, K: int, G: int, modes: Sequence[str], device: str, seed: int, pad: bool,
                impls: Mapping[str, Sequence[Implementation]],
                timeout_s: float | None) -> Iterable[CheckResult]:  # fmt: skip
    """``check_step``'s walk in this process, each scenario's results as soon as they are known."""
    by_key = {(Recipe(recipe), stage): list(found) for stage, found in impls.items() if found}
    if not by_key:
        return
    for m in modes:
        for scenario in scenarios(M, G, pad, padding_alignment(recipe)):
            env, _ = check_inputs(recipe, scenario.M, N, K, scenario.G, device=device, seed=seed, pad=scenario.pad)
            stages = step_to_check(recipe, scenario.M, N, K, scenario.G, m, scenario.pad)
            where = f"{m}, {scenario.label()}"
            yield from check_stages(stages, env, by_key, device=device, timeout_s=timeout_s, where=where)


def checked_apart(target, args: tuple, recipe: Recipe, stage: str, impl: Implementation, timeout_s: float,
                  where_of: Callable[[int], str]) -> list[CheckResult]:
    """``target(send, *args)``, the check of ``impl`` of ``stage``, in a child process (``apart.run_apart``): the
    results it sent, then, when it ended early, one ERROR row naming why, ``where_of(results sent)`` saying where."""
    ran = run_apart(target, args, timeout_s=timeout_s)
    results = list(ran.results)
    if ran.failure is not None:
        results.append(CheckResult(recipe, stage, impl.name, Verdict.ERROR, ran.failure.splitlines()[0],
                                   trace=ran.failure, where=where_of(len(ran.results))))  # fmt: skip
    return results


def watched_in_child(impl: Implementation, send, device: str) -> Implementation:
    """In a child of ``apart.run_apart``: ``device`` made current, and ``impl`` calling ``send`` just before and
    after each call of its function (the parent's time limit runs only between the two)."""
    if torch.device(device).type == "cuda" and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))
    fn = impl.fn

    def announced(*args, **kwargs):
        send(("calling",))
        try:
            return fn(*args, **kwargs)
        finally:
            send(("returned",))

    return dataclasses.replace(impl, fn=announced)


def _check_in_child(send, recipe, M, N, K, G, modes, device, seed, pad, stage: str, impl: Implementation) -> None:
    """``check_step`` of one outside implementation, in its own process (``apart.run_apart``): each result sent as
    it is known, and the parent told when the implementation is called and when it returns (its time limit runs
    only then; a hang is ended by the parent killing this process)."""
    watched = watched_in_child(impl, send, device)  # called in this thread, without a limit: the parent keeps it
    for r in _check_here(recipe, M, N, K, G, modes, device, seed, pad, {stage: [watched]}, None):
        send(("result", r))


def merged(results: Iterable[CheckResult]) -> list[CheckResult]:
    """One result per (recipe, stage, implementation), in first-seen order: its worst verdict (``WORST_FIRST``),
    with every finding of that verdict (each saying where it was found)."""
    groups: dict[tuple, list[CheckResult]] = {}
    for r in results:
        groups.setdefault((r.recipe, r.stage, r.impl), []).append(r)
    rows = []
    for found in groups.values():
        worst = min(found, key=lambda r: WORST_FIRST.index(r.verdict))
        same = [r for r in found if r.verdict == worst.verdict]
        if worst.verdict in (Verdict.PASS, Verdict.SKIP) or len(same) == 1:
            rows.append(worst)
            continue
        rows.append(dataclasses.replace(worst, detail="; ".join(f"[{r.where}] {r.detail}" for r in same), where="",
                                        parts=tuple(same)))  # fmt: skip
    return rows


def native_line(recipe: str, device: torch.device | str) -> str:
    """What the native backend decided for ``recipe`` on ``device``, and why: for MXFP8 on SM100 what its probe at
    first use found (the build's kernel image for the card, the known-answer GEMMs) or why it failed."""
    device = torch.device(device)
    found = gemm_native.verdict(recipe, gemm_native.capability(device), device)
    return f"native {recipe} on {device}: {'available' if found.available else 'unavailable'}: {found.reason}"


def json_report(results: Iterable[CheckResult], load_errors: Sequence[tuple[str, str]] = (),
                native: str | None = None) -> str:  # fmt: skip
    """Every result (one per mode, scenario, stage and implementation), the plugins that did not load and, when
    a GEMM stage was checked, the native backend's verdict (``native_line``; else null)."""
    payload = {"native": native, "results": [r.as_dict() for r in results],
               "load_errors": [{"origin": o, "error": e} for o, e in load_errors]}  # fmt: skip
    return json.dumps(payload, indent=2) + "\n"


def exit_code(results: Iterable[CheckResult], load_errors: Sequence[tuple[str, str]] = ()) -> int:
    """0 every checked implementation passed; 1 one failed or raised, or a plugin did not load. Nothing checked
    at all (and nothing failed) is unusable input."""
    results = list(results)
    if load_errors or any(r.verdict in (Verdict.FAIL, Verdict.ERROR) for r in results):
        return 1
    if not any(r.verdict in (Verdict.PASS, Verdict.DEVIATES) for r in results):
        reasons = "; ".join(f"{r.stage}/{r.impl}: {r.detail}" for r in merged(results)) or "no implementation selected"
        raise InputError(f"nothing was checked: {reasons}")
    return 0
