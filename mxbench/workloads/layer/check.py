"""``mxbench check --layer``: every stage of the MoE layer's own (``mxkernels.stages.layer_specs``) against its oracle.

The layer is built at a small size in the recipe asked (its fused stages too, where the recipe has them), on the
seeded layer inputs with adversarial MX blocks planted in the tokens and the output gradient (``check_inputs.plant``:
along the model dim and down the tokens; up to ``MAX_PLANTED``), in two configurations that between them take every layer stage: scores
before the experts with one shared expert and skewed routing, and scores after the experts with the gate and up
projections apart, the router's own top-k and softmax scores. A third scenario routes fewer token copies than there
are experts. The walk is ``check.check_stages``: each stage's inputs are the oracles' outputs of the stages before
it, and every implementation (mxkernels' own, or an ``--impl STAGE=module:function`` of a layer stage) is compared
with its stage's oracle by the spec's rule. The expert projections' stages are the step's (``mxbench check``).
With ``--wgrad bf16`` the layer runs its weight gradients as bf16 GEMMs; each scenario then also runs the whole layer
(chains and fused twin) and holds every expert weight gradient to DY^T X in fp64 (``check_bf16_wgrad``), which
catches a wgrad bound to the wrong operand or run in the recipe.

As in ``mxbench check``, an outside implementation (``--impl STAGE=module:function``) runs in a process of its own
(``implementations.apart``): a crash, an exit, a signal, a hang or a CUDA context it breaks is its ERROR row and the
check goes on; mxkernels' own run here, as they are timed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from mxkernels.autograd.layer import layer_inputs
from mxkernels.core.names import OURS, Recipe, Wgrad, parse_wgrad
from mxkernels.stages.layer import LayerShape, layer_stages
from mxkernels.stages.layer_specs import FUSED_RECIPES, get_layer_spec, layer_specs

from ...implementations.apart import picklable
from ...implementations.check import CheckResult, Verdict, check_stages, checked_apart, watched_in_child
from ...implementations.check_inputs import plant
from ...implementations.registry import Implementation, Registry

# (label, the layer's options): the two configurations between them run every stage of the layer's own.
CONFIGS = (
    ("scores first, shared expert, skewed", dict(score_before=True, shared=1, routing="skewed")),
    ("scores last, gate and up apart, router top-k", dict(score_before=False, fuse_up=False, routing="router",
                                                          score_func="softmax")),
)  # fmt: skip


# The largest planted value: the e4m3 limit blocks (448, 500, 3584) stay; 1e30 would overflow SwiGLU's products of
# products to infinities whose GEMM sums (inf - inf) no contract fixes.
MAX_PLANTED = 4096.0


def layer_registry() -> Registry:
    """mxkernels' implementation of every stage of the layer's own, in a registry of that table."""
    registry = Registry(spec_of=_layer_spec)
    for spec in layer_specs().values():
        registry.add(Implementation(spec.recipe, spec.name, "mxkernels", spec.impl, spec.kernel))
    return registry


def _fusions(recipe: str, shape: LayerShape) -> tuple[bool, ...]:
    """The layer's chains, and its fused twin where the recipe has one."""
    return (False, True) if Recipe(recipe) in FUSED_RECIPES and shape.fuse_up else (False,)


def _stages(recipe: str, shape: LayerShape, mode: str, wgrad: Wgrad = Wgrad.RECIPE):
    """The layer's stages, then the fused stages of its fused twin (checked after the chains, on the same inputs)."""
    stages = layer_stages(recipe, shape, mode=mode, wgrad=wgrad)
    names = {s.name for s in stages}
    for fuse in _fusions(recipe, shape)[1:]:
        stages += [s for s in layer_stages(recipe, shape, mode=mode, fuse=fuse, wgrad=wgrad) if s.name not in names]
    return stages


def check_bf16_wgrad(recipe: str, shape: LayerShape, env, *, mode: str, where: str) -> list[CheckResult]:
    """``--wgrad bf16``: the whole layer (mxkernels' stages, chains and fused twin) run on ``env``, and each expert
    weight gradient its bf16 wgrad stage wrote compared, by the bf16 ``gemm_wgrad`` spec's rule, with DY^T X summed
    in fp64 (``reference.layer_wgrad``: DY the layer's own FP8 output gradient, X rebuilt from its inputs)."""
    from mxkernels.reference.layer_wgrad import layer_wgrad_bf16
    from mxkernels.stages.pipeline import run_stages
    from mxkernels.stages.step_specs import get_spec

    rule = get_spec(Recipe.BF16, "gemm_wgrad").rule
    results = []
    for fuse in _fusions(recipe, shape):
        at = f"{where}{', fused' if fuse else ''}"
        stages = layer_stages(recipe, shape, mode=mode, fuse=fuse, wgrad=Wgrad.BF16)
        try:
            ran = run_stages(stages, dict(env))
            expected = layer_wgrad_bf16(ran, fuse_up=shape.fuse_up, score_before=shape.score_before,
                                        shared_in_recipe=shape.shared_in_recipe and recipe != Recipe.BF16)  # fmt: skip
        except Exception as e:  # noqa: BLE001 -- a layer that cannot run is this check's ERROR row
            results.append(CheckResult(Recipe.BF16, "gemm_wgrad", OURS, Verdict.ERROR, f"{type(e).__name__}: {e}",
                                       where=at))  # fmt: skip
            continue
        for name, want in expected.items():
            stage = next(st for st in stages if name in st.outputs)
            wrong = rule.compare(name, ran[name], want)
            detail = f"{name} against DY^T X (fp64 sums rounded to bf16): {rule.describe()}"
            results.append(CheckResult(stage.recipe, stage.name, OURS, Verdict.FAIL if wrong else Verdict.PASS,
                                       detail, mismatches=(wrong,) if wrong else (), input_texts=(None,) if wrong
                                       else (), where=at))  # fmt: skip
    return results


def check_layer(recipe: str, K: int, N: int, G: int, T: int, impls: Mapping[tuple[Recipe, str], Sequence[Implementation]],
                *, modes: Sequence[str] = ("rceil",), device="cpu", seed: int = 0,
                timeout_s: float = 300.0, wgrad: Wgrad | str = Wgrad.RECIPE,
                whole: bool = True) -> list[CheckResult]:  # fmt: skip
    """Every implementation in ``impls`` ((recipe, stage) of a layer spec -> implementations) at each scenario
    (module doc) and scale mode: T tokens of width K, G experts of hidden N, top-2. ``wgrad`` bf16: the layer's
    stages with the bf16 weight gradient, and (``whole``) its weight gradients against their oracle
    (``check_bf16_wgrad``)."""
    wgrad = parse_wgrad(wgrad)
    results = []
    scenarios = [(label, T, config) for label, config in CONFIGS]
    scenarios.append(("fewer copies than experts", max(1, (G - 1) // 2), CONFIGS[0][1]))
    for mode in modes if Recipe(recipe) == Recipe.MXFP8 else modes[:1]:
        for label, tokens, config in scenarios:
            shape = LayerShape(T=tokens, K=K, N=N, E=G, top_k=min(2, G), **config)
            env = layer_inputs(shape, device=device, seed=seed)
            for name, finite in (("x", Recipe(recipe) != Recipe.MXFP8), ("dy", True)):
                plant(env[name], 0, tokens, finite, MAX_PLANTED)
            where = f"layer: {label}, T={tokens}, {mode}"
            results += check_stages(_stages(recipe, shape, mode, wgrad), env, impls, device=device,
                                    timeout_s=timeout_s, where=where)  # fmt: skip
            if wgrad == Wgrad.BF16 and whole:
                results += check_bf16_wgrad(recipe, shape, env, mode=mode, where=where)
    return results


def check_layer_apart(recipe: str, K: int, N: int, G: int, T: int,
                      impls: Mapping[tuple[Recipe, str], Sequence[Implementation]], *, modes: Sequence[str] = ("rceil",),
                      device="cpu", seed: int = 0, timeout_s: float = 300.0,
                      wgrad: Wgrad | str = Wgrad.RECIPE) -> list[CheckResult]:  # fmt: skip
    """``check_layer`` with every outside implementation (origin ``--impl``, picklable) in a child process of its
    own (module doc), on the same inputs made again there from ``seed``; the others, and the whole layer's bf16
    weight gradients, here. A child that ends early adds one ERROR row naming why."""
    wgrad = parse_wgrad(wgrad)
    apart = [(key, i) for key, found in impls.items() for i in found if i.origin == "--impl" and picklable(i) is None]
    here = {key: kept for key, found in impls.items() if (kept := [i for i in found if (key, i) not in apart])}
    job = (recipe, K, N, G, T, tuple(modes), str(torch.device(device)), seed, wgrad)
    results = []
    if here or wgrad == Wgrad.BF16:
        results = check_layer(*job[:5], here, modes=modes, device=device, seed=seed, timeout_s=timeout_s, wgrad=wgrad)
    for key, impl in apart:
        results += checked_apart(_check_layer_in_child, (*job, key, impl), Recipe(recipe), key[1], impl, timeout_s,
                                 lambda _: "layer")  # fmt: skip
    return results


def _check_layer_in_child(send, recipe, K, N, G, T, modes, device, seed, wgrad, key, impl: Implementation) -> None:
    """``check_layer`` of one outside implementation in its own process (``apart.run_apart``): each result sent as
    it is known, the parent told when the implementation is called and when it returns (its time limit runs only
    then)."""
    watched = watched_in_child(impl, send, device)
    for r in check_layer(recipe, K, N, G, T, {key: [watched]}, modes=modes, device=device, seed=seed, timeout_s=None,
                         wgrad=wgrad, whole=False):  # fmt: skip
        send(("result", r))


def layer_impls(impls, recipe: str) -> dict[tuple[Recipe, str], list[Implementation]]:
    """Of ``impls`` (a registry, or implementations), those of the stages a ``recipe`` layer runs: the common
    stages (declared under bf16) and the recipe's own, by (recipe, stage)."""
    wanted = {Recipe.BF16, Recipe(recipe)}
    out: dict[tuple[Recipe, str], list[Implementation]] = {}
    for impl in impls:
        if impl.recipe in wanted:
            out.setdefault((impl.recipe, impl.stage), []).append(impl)
    return out


def parse_layer_impl(text: str) -> Implementation:
    """``--impl STAGE=module:function`` of a layer stage (``STAGE`` or ``RECIPE/STAGE``; common stages are bf16's)."""
    from ...implementations.registry import parse_impl

    stage = text.partition("=")[0]
    return parse_impl(text, Recipe.BF16 if "/" not in stage else stage.split("/")[0], _layer_spec)


def _layer_spec(recipe: str, stage: str):
    try:
        return get_layer_spec(recipe, stage)
    except (KeyError, ValueError):
        from mxkernels.core.errors import InputError

        known = ", ".join(sorted({f"{r}/{n}" for r, n in layer_specs()}))
        raise InputError(f"the layer has no stage {recipe}/{stage}; its own stages: {known}") from None


def check_command(impl_texts, stages, recipe, K, N, G, M, modes, seed, timeout_s, fmt, verbose,
                  wgrad: str = Wgrad.RECIPE) -> int:  # fmt: skip
    """``mxbench check --layer``: the layer's own stages (mxkernels' and any --impl's), padded, and with ``--wgrad
    bf16`` the layer's bf16 weight gradients against their oracle; the exit code."""
    import click

    from ...clikit.common import torch_device
    from ...clikit.impls import report_check
    from ...implementations.check import exit_code, json_report

    added = [parse_layer_impl(text) for text in impl_texts]
    chosen = layer_impls(added or layer_registry(), recipe)
    if stages:
        chosen = {key: found for key, found in chosen.items() if key[1] in set(stages)}
        missing = set(stages) - {key[1] for key in chosen}
        if missing:
            raise click.BadParameter(f"no layer stage {', '.join(sorted(missing))} for {recipe}", param_hint="--stage")
    results = check_layer_apart(recipe, K, N, G, max(1, M // 8), chosen, modes=modes, device=torch_device(),
                                seed=seed, timeout_s=timeout_s, wgrad=wgrad)  # fmt: skip
    if fmt == "json":
        click.echo(json_report(results), nl=False)
        return exit_code(results)
    return report_check(results, [], fmt, verbose)
