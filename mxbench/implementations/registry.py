"""Implementations of the stages: who computes each stage spec, and whether it can run here.

A stage spec (``mxkernels.stages.step_specs``) says *what* a stage computes; an ``Implementation`` says *how*: the stage it
implements, its name, a callable with the stage's calling contract, and an availability check that returns the
reason it cannot run on a device (None when it can). mxkernels, torchao and ``torch.compile`` of the references are
registered here exactly as a third party's kernels are, in one of three ways:

* the entry-point group ``mxbench.implementations`` of their own package: an entry point names a function
  ``register(registry)`` that calls ``registry.add(...)`` / ``registry.register(...)``;
* ``--impl STAGE=module:function`` on the command line (``parse_impl``): ``function`` has the stage's contract (a
  module in the current folder is found without ``PYTHONPATH``). A registered implementation is picked by name
  (``resolve_impl``): ``--impl STAGE=NAME``, or ``--impl NAME`` for every stage it implements;
* the Python API: ``mxbench.register(stage, fn, name=...)`` or the ``@mxbench.implementation(stage, name=...)``
  decorator, against the process-wide registry (``default.default_registry()``).

The calling contract of a stage (``mxbench impls --stage S`` prints it): ``fn(*inputs, **params)`` with the stage's
input tensors positionally, its params (``mode`` for MX quantize stages) as keywords, returning the stage's outputs
as a tuple in the listed order.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from mxkernels.core.errors import InputError
from mxkernels.core.names import OURS, Recipe
from mxkernels.stages.step_specs import StageSpec, get_spec

from ..instruments.guarded import one_line

ENTRY_POINT_GROUP = "mxbench.implementations"

Availability = Callable[[torch.device], "str | None"]


def always(device: torch.device) -> str | None:
    return None


@dataclass(frozen=True)
class Deviation:
    """A known, named departure of an implementation from the MX spec that ``check`` reports instead of failing:
    it may differ from the oracle inside the blocks whose oracle scale byte is one of ``scale_bytes`` (and only
    there). For example torchao's reference flushes blocks of scale byte 0 (2**-127) and gives Inf blocks a finite
    scale (byte 255 in the spec)."""

    name: str
    scale_bytes: tuple[int, ...]


@dataclass(frozen=True)
class Implementation:
    """One way to compute a stage.

    ``fn(*inputs, **params) -> tuple`` is the stage's contract. ``available(device)`` returns why it cannot run on
    ``device`` (None: it can). ``graph_safe`` False: a CUDA graph cannot capture it (it reads device values on the
    host), so it is timed with events. ``prepare(inputs, params)``, when given, does untimed set-up and returns the
    zero-argument call to time (for example converting offsets to another convention once).
    """

    recipe: Recipe
    stage: str
    name: str
    fn: Callable[..., tuple]
    kernel: str = ""
    available: Availability = always
    graph_safe: bool = True
    prepare: Callable[[Sequence[torch.Tensor], Mapping[str, Any]], Callable[[], object]] | None = None
    origin: str = "python"
    deviation: Deviation | None = None
    code: str | None = None
    """The module whose code runs, where ``fn`` is an adapter defined elsewhere (torchao's kernels behind the
    adapters in ``implementations``); None: ``fn``'s own module."""

    @property
    def spec(self) -> StageSpec:
        return get_spec(self.recipe, self.stage)

    @property
    def module(self) -> str | None:
        """The module whose code this implementation runs (what a run's provenance records name)."""
        if self.code is not None:
            return self.code
        fn = getattr(self.fn, "func", self.fn)  # functools.partial
        return getattr(fn, "__module__", None)

    def unavailable(self, device: torch.device | str) -> str | None:
        """Why this implementation cannot run on ``device``, or None. A check that raises is a reason too."""
        try:
            return self.available(torch.device(device))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 -- third-party code (an exit too): its failure is its reason
            return f"availability check failed: {one_line(e)}"

    def bind(self, inputs: Sequence[torch.Tensor], params: Mapping[str, Any]) -> Callable[[], object]:
        """The zero-argument call to time on ``inputs`` (set-up done here, untimed)."""
        if self.prepare is not None:
            return self.prepare(inputs, params)
        fn, args, kwargs = self.fn, list(inputs), dict(params)
        return lambda: fn(*args, **kwargs)

    def __call__(self, *inputs, **params):
        return self.fn(*inputs, **params)


def _kernel_name(fn: Callable) -> str:
    fn = getattr(fn, "func", fn)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


@dataclass
class Registry:
    """Implementations by (recipe, stage, name), in registration order; mxkernels' first for every stage."""

    impls: dict[tuple[Recipe, str, str], Implementation] = field(default_factory=dict)
    load_errors: list[tuple[str, str]] = field(default_factory=list)
    """(origin, message) of registrations that failed (an entry point that does not load, say)."""
    spec_of: Callable[[str, str], StageSpec] = get_spec
    """(recipe, stage) -> its spec, or an ``InputError``: the table of declarations this registry holds
    implementations of (the single-GPU step's by default; another pipeline passes its own)."""

    def add(self, impl: Implementation, *, replace: bool = False) -> Implementation:
        self.spec_of(impl.recipe, impl.stage)  # the stage must exist
        if not impl.name or "/" in impl.name:
            raise InputError(f"implementation name must be non-empty and free of '/', got {impl.name!r}")
        key = (Recipe(impl.recipe), impl.stage, impl.name)
        if key in self.impls and not replace:
            raise InputError(f"{impl.recipe}/{impl.stage} already has an implementation named {impl.name!r}")
        self.impls[key] = impl
        return impl

    def register(
        self,
        stage: str,
        fn: Callable[..., tuple] | None = None,
        *,
        name: str,
        recipe: str = Recipe.MXFP8,
        kernel: str | None = None,
        available: Availability | None = None,
        graph_safe: bool = True,
        origin: str = "python",
    ):
        """Register ``fn`` as implementation ``name`` of ``stage`` (of ``recipe``); without ``fn``, a decorator."""

        def add(f: Callable[..., tuple]) -> Callable[..., tuple]:
            self.add(Implementation(Recipe(recipe), stage, name, f, kernel or _kernel_name(f),
                                    available or always, graph_safe, origin=origin))  # fmt: skip
            return f

        return add if fn is None else add(fn)

    def of(self, recipe: str, stage: str) -> list[Implementation]:
        """Implementations of one stage, mxkernels' first, then in registration order."""
        found = [i for (r, s, _), i in self.impls.items() if r == Recipe(recipe) and s == stage]
        return sorted(found, key=lambda i: i.name != OURS)

    def get(self, recipe: str, stage: str, name: str) -> Implementation:
        key = (Recipe(recipe), stage, name)
        if key not in self.impls:
            names = ", ".join(i.name for i in self.of(recipe, stage)) or "none"
            raise InputError(f"{recipe}/{stage} has no implementation {name!r}; it has: {names}")
        return self.impls[key]

    def names(self) -> list[str]:
        """Every implementation name, first-registered first."""
        return list(dict.fromkeys(name for (_, _, name) in self.impls))

    def __iter__(self):
        return iter(self.impls.values())


# ---------------------------------------------------------------------------------------------------------------
# --impl STAGE=module:function
# ---------------------------------------------------------------------------------------------------------------


def split_stage(text: str, recipe: str = Recipe.MXFP8, spec_of=get_spec) -> tuple[Recipe, str]:
    """``"quantize_a"`` (of ``recipe``) or ``"fp8_rowwise/quantize_a"`` -> (recipe, stage), checked against
    ``spec_of`` (the single-GPU step's specs; ``ep_stages.get_ep_spec`` for the expert-parallel step)."""
    if "/" in text:
        recipe, text = text.split("/", 1)
        try:
            recipe = Recipe(recipe)
        except ValueError:
            raise InputError(f"unknown recipe {recipe!r} in {text!r}; recipes: {', '.join(Recipe)}") from None
    spec_of(recipe, text)
    return Recipe(recipe), text


def load_callable(target: str, option: str = "--impl") -> Any:
    """``module:function`` (or ``module:Class.attr``) -> the object; bad input is an ``InputError``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{option}: {target!r} must be module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # a module in the current folder, as `python -m mxbench` would find it
    try:
        obj = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 -- any import failure of a user module (an exit too) is bad input
        raise InputError(f"{option}: cannot import {module_name!r} ({one_line(e)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{option}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj) and not isinstance(obj, Implementation):
        raise InputError(f"{option}: {target} is not callable")
    return obj


def parse_impl(text: str, recipe: str = Recipe.MXFP8, spec_of=get_spec) -> Implementation:
    """``STAGE=module:function`` -> an Implementation named ``module:function`` (origin ``--impl``); the stage is
    looked up with ``spec_of`` (see ``split_stage``)."""
    stage, sep, target = text.partition("=")
    if not sep or not stage or not target:
        raise InputError(f"--impl: {text!r} must be STAGE=module:function")
    r, stage = split_stage(stage.strip(), recipe, spec_of)
    obj = load_callable(target.strip())
    if isinstance(obj, Implementation):
        if (obj.recipe, obj.stage) != (r, stage):
            raise InputError(f"--impl: {target} implements {obj.recipe}/{obj.stage}, not {r}/{stage}")
        return obj
    return Implementation(r, stage, target.strip(), obj, _kernel_name(obj), origin="--impl")


def resolve_impl(registry: Registry, text: str, recipe: str = Recipe.MXFP8) -> list[Implementation]:
    """One ``--impl``: ``NAME`` (every stage of ``recipe`` that the registered implementation NAME implements),
    ``STAGE=NAME`` (a registered implementation of STAGE) or ``STAGE=module:function`` (``parse_impl``)."""
    stage, sep, target = text.partition("=")
    if not sep:
        found = [i for i in registry if i.name == text.strip() and i.recipe == Recipe(recipe)]
        if not found:
            names = ", ".join(n for n in registry.names() if n != OURS)
            raise InputError(f"--impl: no {recipe} implementation named {text!r} is registered here (registered: "
                             f"{names or 'none but mxkernels'}); or give STAGE=module:function")  # fmt: skip
        return found
    r, name = split_stage(stage.strip(), recipe)
    if (r, name, target.strip()) in registry.impls:
        return [registry.impls[r, name, target.strip()]]
    if ":" not in target or target.strip().startswith(f"{OURS}:"):
        names = ", ".join(i.name for i in registry.of(r, name))
        raise InputError(f"--impl: {target.strip()!r} is no implementation of {r}/{name} registered here (it has: "
                         f"{names}) and not module:function")  # fmt: skip
    return [parse_impl(text, recipe)]


def with_cli_impls(registry: Registry, texts: Iterable[str], recipe: str = Recipe.MXFP8) -> list[Implementation]:
    """Every ``--impl`` (``resolve_impl``) added to ``registry`` (a module:function one replacing one of the same
    name) and returned, in order."""
    added = []
    for text in texts:
        for impl in resolve_impl(registry, text, recipe):
            added.append(registry.add(impl, replace=True))
    stages = [(i.recipe, i.stage) for i in added]
    twice = sorted({f"{r}/{s}" for r, s in stages if stages.count((r, s)) > 1})
    if twice:
        raise InputError(f"--impl: one implementation per stage in a step; given twice: {', '.join(twice)}")
    return added
