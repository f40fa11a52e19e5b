"""The ``Backend`` record: everything the front door (``grouped_gemm``) and the harness need to know of one grouped-GEMM
backend, declared once in the backend's own module. ``backends`` lists the declarations; ``BACKENDS``, the default
order per device, the config and out_dtype checks and the dispatch are all read from them.

How the front door calls a backend's run function for a recipe (the operands already checked, see ``grouped_gemm``):

* MXFP8: ``run(a_q, a_sb, b_q, b_sb, offs, out_dtype, config=...)``;
* FP8 rowwise: ``run(a_q, a_scale, b_q, b_scale, offs, out_dtype, config=..., use_fast_accum=...)``;
* bf16: ``run(a, b, offs)`` on ``torch._grouped_mm``'s operands, bf16 output.

``config`` is passed only to a backend that declares a ``config_type`` (None or an instance of it); the rest choose
their own launch. ``use_fast_accum`` asks for the native kernel's fast sums; the other backends ignore it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

import torch

from ..core.errors import InputError
from ..core.names import Recipe
from ..core.runtime import INTERPRET

Capability = tuple[int, int] | None
"""A CUDA device's compute capability; None for any other device (the CPU, where Triton runs interpreted)."""


class Arch(StrEnum):
    """The device classes whose default backend order differs."""

    CPU = "cpu"  # no CUDA device: Triton backends run in the interpreter (tests), slowly
    SM100 = "sm100"  # compute capability 10.x: block-scaled tensor cores
    SM90 = "sm90"  # 9.0: fp8 wgmma, no block-scaled MMA
    OTHER = "other"  # every other GPU (SM89, SM120, ...)


class GemmCase(StrEnum):
    """Which grouped GEMM a call is, by its operands' dimensions (``grouped_gemm``'s module doc). A member equals its
    string ("2d3d" == GemmCase.A2D_B3D), the form tuning files and stored runs hold, so those still load and compare;
    ``parse`` takes either at the seams."""

    A2D_B3D = "2d3d"  # a (M, K) in row groups, b (G, N, K) one weight per group -> (M, N): forward, dgrad
    A2D_B2D = "2d2d"  # a (N, M), b (K, M), the contraction M split by the groups -> (G, N, K): wgrad

    @classmethod
    def parse(cls, case: object) -> GemmCase:
        """``case`` as a member; a clear ``InputError`` for anything else."""
        try:
            return cls(case)
        except (ValueError, TypeError):
            raise InputError(f"case must be '2d3d' or '2d2d', got {case!r}") from None

    @classmethod
    def of_b(cls, b: torch.Tensor) -> GemmCase:
        """The case of a call whose b operand is ``b``: 3D (one weight per group) or 2D."""
        return cls.A2D_B3D if b.dim() == 3 else cls.A2D_B2D


def arch_of(cap: Capability) -> Arch:
    if cap is None:
        return Arch.CPU
    if cap[0] == 10:
        return Arch.SM100
    return Arch.SM90 if cap == (9, 0) else Arch.OTHER


FIRST, DEFAULT_RANK, LATER, LAST = 0, 1, 2, 9
"""Ranks of ``Backend.preference``: lower goes first; equal ranks keep the order of ``backends.DECLARED``."""

OUT_DTYPES = (torch.bfloat16, torch.float32)
"""The output dtypes the front door takes; a backend declares the ones it writes."""


@dataclass(frozen=True)
class Backend:
    """One grouped-GEMM backend. Two records may share a name if they serve different recipes: a name is one kernel
    family within a recipe ("triton" is ``mx_triton`` for MXFP8 and ``fp8_triton`` for FP8 rowwise)."""

    # What ``backend=`` takes, and what the harness calls the implementation (``mxkernels:<name>``).
    name: str
    # Recipe -> the function computing it (calling convention: module doc). Its keys are the recipes served.
    run: Mapping[Recipe, Callable[..., torch.Tensor]]
    # Why it cannot run a recipe on a device of a compute capability, or None if it can: asked before every call, so
    # an unavailable backend is refused before any launch and skipped when the default is chosen.
    unavailable: Callable[[Recipe, Capability, torch.device], str | None]
    # The launch configuration ``config=`` takes (its instances are frozen and check themselves); None: it takes none.
    config_type: type | None = None
    # What it can write: torch._grouped_mm and the native MX kernel write bf16 only.
    out_dtypes: tuple[torch.dtype, ...] = OUT_DTYPES
    # Rank in the default order per ``Arch`` (absent: ``DEFAULT_RANK``): measured speed decides, docs/perf-log.md.
    preference: Mapping[Arch, int] = field(default_factory=dict)
    # False where Triton's interpreter runs its dots (or fp32 registers) at bf16 precision: its CPU results cannot be
    # judged against the oracle, so the harness checks it on a GPU only.
    interpreter_exact: bool = True

    def __post_init__(self):
        if not self.name or not self.name.isidentifier():
            raise InputError(f"a backend's name must be an identifier, got {self.name!r}")
        unknown = [r for r in self.run if r not in tuple(Recipe)]
        if not self.run or unknown:
            raise InputError(f"backend {self.name!r} must run one or more of {', '.join(Recipe)}; got {list(self.run)}")
        object.__setattr__(self, "run", MappingProxyType({Recipe(r): fn for r, fn in self.run.items()}))

    @property
    def recipes(self) -> frozenset[Recipe]:
        return frozenset(self.run)

    def rank(self, arch: Arch) -> int:
        return self.preference.get(arch, DEFAULT_RANK)


def late(module: str, name: str, /, **bound) -> Callable[..., torch.Tensor]:
    """``module``'s function ``name`` as it is at each call, with the ``bound`` keywords: a test that patches the
    module's run function (a spy, a planted fault) patches what the front door runs, as when it called the module."""

    def call(*args, **kwargs):
        return getattr(sys.modules[module], name)(*args, **bound, **kwargs)

    call.__qualname__ = call.__name__ = name
    return call


def triton_unavailable(recipe: Recipe, cap: Capability, device: torch.device) -> str | None:
    """The gate every Triton backend shares: a CUDA GPU with fp8 tensor cores, or the CPU under the interpreter."""
    if cap is None:
        return None if INTERPRET else f"the Triton backends need a CUDA device (or TRITON_INTERPRET=1), got {device}"
    if cap < (8, 9):
        return f"the Triton MXFP8 backends need fp8 tensor cores (compute capability >= 8.9), this GPU is {cap}"
    return None


def always_available(recipe: Recipe, cap: Capability, device: torch.device) -> None:
    """For a backend that runs anywhere torch does (the emulation, a test's plain-torch backend)."""
    return None
