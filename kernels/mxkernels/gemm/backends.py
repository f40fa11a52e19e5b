"""Every grouped-GEMM backend, one line each: each module declares its own ``Backend`` (``backend``), and this list
is all the front door (``grouped_gemm``) and the harness read. A new backend is a module that declares one, and a
line here; a plug-in (or a test) adds one at run time with ``register_backend``.

The order matters twice: it is the order of ``grouped_gemm.BACKENDS`` per recipe (and of the harness's rows), and it
breaks ties between equal ranks of ``Backend.preference`` in the default order.
"""

from __future__ import annotations

from . import dequant, emulated, fp8_triton, fp8_ws, fused, mx_triton, native
from .backend import Backend
from ..core.errors import InputError
from ..core.names import Recipe

DECLARED: list[Backend] = [
    native.BACKEND,
    mx_triton.TRITON,
    fp8_triton.TRITON,
    fp8_triton.TRITON_FAST,
    fp8_ws.BACKEND,
    dequant.BACKEND,
    fused.BACKEND,
    mx_triton.TRITON_FP8,
    emulated.BACKEND,
]


def declared(recipe: Recipe | str) -> list[Backend]:
    """The backends serving ``recipe``, in declaration order."""
    return [b for b in DECLARED if recipe in b.recipes]


def find(recipe: Recipe | str, name: str) -> Backend | None:
    return next((b for b in declared(recipe) if b.name == name), None)


def register_backend(backend: Backend) -> Backend:
    """Adds ``backend`` after the built-in ones (at its ranks it goes before them only where it outranks them):
    ``grouped_gemm`` dispatches to it and the harness lists and checks it as ``mxkernels:<name>``. Refused if a
    declared backend of that name serves one of its recipes."""
    if not isinstance(backend, Backend):
        raise InputError(f"register_backend takes a Backend, got {backend!r}")
    taken = sorted(r.value for r in backend.recipes if find(r, backend.name) is not None)
    if taken:
        raise InputError(f"a backend named {backend.name!r} already serves {', '.join(taken)}")
    DECLARED.append(backend)
    return backend


def unregister_backend(backend: Backend) -> None:
    """Takes back what ``register_backend`` added (a test's throwaway backend)."""
    DECLARED.remove(backend)
