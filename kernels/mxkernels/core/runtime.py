"""Argument checks and the execution target shared by every kernel wrapper.

Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter (``TRITON_INTERPRET=1``, which must be
set before ``mxkernels`` is imported). Every public wrapper validates its arguments here first, so bad input fails
with an ``InputError`` (a ``ValueError``) that names the argument before anything is launched. Launch configurations
are frozen dataclasses that check their own fields when built, with the helpers here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import torch

from .errors import InputError

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _patch_language_once_per_launch() -> None:
    """The Triton interpreter patches triton.language (an inspect.getmembers scan of its modules) on every call of a
    device function, not only when a kernel launches: about a third of an interpreted kernel's time on CPU (the
    test suite, ``mxbench check`` and the EP workers without a GPU). Inside a launch, the modules that the launch
    (or an earlier call in it) patched stay patched until the launch ends, so such a call has nothing to do: it is
    skipped. Calls outside a launch, and device functions that see other language modules, patch as before. This
    leans on Triton's private names: where they are missing (another Triton), the interpreter runs as it comes."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    real_patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if real_patch is None or executor is None or getattr(real_patch, "once_per_launch", False):
        return
    real_launch = executor.__call__
    launches: list[frozenset] = []  # per launch in progress: the language modules patched in it so far

    def patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if launches and langs and langs <= launches[-1]:
            return None  # a device function's call: the launch's own call, its first, has patched these
        scope = real_patch(fn)
        if launches:
            launches[-1] |= langs
        return scope

    def launch(self, *args, **kwargs):
        launches.append(frozenset())
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch


if INTERPRET:
    _patch_language_once_per_launch()

def default_launch(measured, interpreted):
    """The launch a wrapper takes when given none (``config=None``): ``measured``, the tuned GPU default; under the
    interpreter, ``interpreted``: fewer, larger programs. The interpreter runs each program as a Python loop of numpy
    calls whose cost is per call, not per element, so at the CPU suite's sizes a kernel's time is about its program
    count, and the GPU's short tiles (8 rows) made it several times longer than it need be. A tile decides only which
    program computes which elements, so the results are the same bit for bit; the kernel tests that need several
    programs per block, or the GPU default's own path, pass those configs explicitly."""
    return interpreted if INTERPRET else measured


def launch_by_width(table, cols: int):
    """The launch of the first class of ``table`` ((widest row, launch) pairs, narrowest first) that rows of ``cols``
    fit; None past the widest."""
    return next((config for widest, config in table if cols <= widest), None)


def fit_interpreted(config, default, rows: int, cols: int):
    """``config`` with its tile shrunk to a (rows, cols) matrix smaller than it (powers of two, at least 32 each)
    when it is ``default``, the interpreter's own default launch, and the interpreter runs; otherwise ``config``
    as given (a launch a caller chose; every launch on a GPU). The interpreter pays for every element of a tile,
    masked or not: a 128 x 512 tile over a 32 x 1 expert did 512 times the work (512 such experts: a minute), over
    the EP check's 64-wide rows 8 times. The tile decides only which program computes which elements, so the
    results are the same bit for bit."""
    if not (INTERPRET and config is default):
        return config
    tile = tuple(min(t, max(32, 1 << (n - 1).bit_length())) for t, n in zip(config.tile, (rows, cols)))
    return config if tile == config.tile else replace(config, tile=tile)


MAX_GROUPS = 512
"""Most token groups (local experts) one call takes: the grouped kernels map tiles to groups in one pass over offs,
and torch's grouped GEMMs share the limit."""




def check_tensor(
    name: str,
    x: object,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | Iterable[int] | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Raise ``InputError`` naming ``name`` unless ``x`` is a tensor of the given dtypes, rank and layout that a
    kernel can run on (CUDA, or CPU under the interpreter)."""
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if x.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise InputError(f"{name} must have dtype {names}; got {str(x.dtype).removeprefix('torch.')}")
    if ndim is not None:
        ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in ranks:
            raise InputError(f"{name} must be {' or '.join(f'{r}D' for r in ranks)}, got shape {tuple(x.shape)}")
    if contiguous and not x.is_contiguous():
        raise InputError(f"{name} must be contiguous (row-major); call .contiguous() first")
    check_device(name, x)
    return x


def check_device(name: str, x: torch.Tensor) -> None:
    if x.is_cuda:
        return
    if x.device.type == "cpu" and INTERPRET:
        return
    raise InputError(
        f"{name} is on {x.device}: the kernels need a CUDA tensor "
        "(CPU tensors run only under the Triton interpreter, TRITON_INTERPRET=1 set before import)"
    )


def check_multiple(name: str, value: int, multiple: int, what: str) -> None:
    if value % multiple:
        raise InputError(f"{name}: {what} must be a multiple of {multiple}, got {value}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_power_of_two(name: str, value: object, lo: int = 1, hi: int | None = None) -> int:
    """``value`` must be a power of two in [lo, hi] (hi None: no upper bound)."""
    if not _is_int(value) or value < max(lo, 1) or value & (value - 1) or (hi is not None and value > hi):
        bounds = f" from {lo} to {hi}" if hi is not None else (f" >= {lo}" if lo > 1 else "")
        raise InputError(f"{name} must be a power of two{bounds}, got {value!r}")
    return value


def check_fields_power_of_two(config: object, *fields: str) -> None:
    """Each named field of a launch configuration must be a power of two (the error names ``Class.field``)."""
    for field in fields:
        check_power_of_two(f"{type(config).__name__}.{field}", getattr(config, field))


def check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` must be an int in [lo, hi] (hi None: no upper bound)."""
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        if hi is not None:
            want = f"an int from {lo} to {hi}"
        else:
            want = {0: "a non-negative int", 1: "a positive int"}.get(lo, f"an int >= {lo}")
        raise InputError(f"{name} must be {want}, got {value!r}")
    return value


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 4 elsewhere (the interpreter: a few programs, so that each walks several work items)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def persistent_programs(items: int, device: torch.device, per_sm: int = 1, cap: int | None = None) -> int:
    """The grid of a persistent kernel over ``items`` work items: min(items, SMs x per_sm, cap), at least 1."""
    return max(min(items, sm_count(device) * per_sm, cap or items), 1)


def tile_launch(config) -> dict:
    """Launch arguments of a tiled kernel's configuration (fields block_m, block_n, num_warps, num_stages, maxnreg):
    the BLOCK_M / BLOCK_N constexprs and Triton's options, maxnreg only when set (None leaves it to ptxas)."""
    launch = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "num_warps": config.num_warps,
              "num_stages": config.num_stages}  # fmt: skip
    if config.maxnreg is not None:
        launch["maxnreg"] = config.maxnreg
    return launch


def check_tile_config(config, tiles: tuple[str, ...], positive: tuple[str, ...], optional: tuple[str, ...] = ()):
    """The checks the tiled GEMM launches (``tile_launch``'s fields) share, errors naming ``Class.field``: the
    ``tiles`` fields powers of two >= 16 (``tl.dot``'s smallest operand dim), num_warps 4 or 8 (one or two
    warpgroups, the units a Hopper MMA is issued by), the ``positive`` fields ints >= 1, the ``optional`` ones too
    unless None."""
    kind = type(config).__name__
    for name in tiles:
        check_power_of_two(f"{kind}.{name}", getattr(config, name), lo=16)
    if config.num_warps not in (4, 8):
        raise InputError(f"{kind}.num_warps must be 4 or 8 (one or two warpgroups), got {config.num_warps!r}")
    for name in (*positive, *(name for name in optional if getattr(config, name) is not None)):
        check_int(f"{kind}.{name}", getattr(config, name), 1)


def check_config(name: str, config: object, kind: type | tuple[type, ...], why: str = "") -> None:
    """``config`` must be None (the measured default) or a ``kind`` launch configuration (one of them, for a
    tuple); ``why`` says more."""
    if config is not None and not isinstance(config, kind):
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InputError(f"{name} must be a {kinds} or None{why}, got {config!r}")


def check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def check_same_device(name: str, x: torch.Tensor, like: torch.Tensor, like_name: str = "the data") -> None:
    if x.device != like.device:
        raise InputError(f"{name} is on {x.device} but {like_name} is on {like.device}")


def check_offsets(offs: object, name: str = "offs") -> torch.Tensor:
    """``offs``: int32 (G,) cumulative group end rows, 1 <= G <= MAX_GROUPS. Values are not read (that would sync)."""
    offs = check_tensor(name, offs, dtypes=(torch.int32,), ndim=1)
    if not 1 <= offs.numel() <= MAX_GROUPS:
        raise InputError(f"{name} must hold 1 to {MAX_GROUPS} group ends, got {offs.numel()}")
    return offs


def check_group_offsets(offs: object, like: torch.Tensor, total: int, multiple: int = 1) -> torch.Tensor:
    """``offs`` for token groups of ``like``'s ``total`` rows: ``check_offsets``, on ``like``'s device, and its
    values checked by ``check_host_offsets`` where that costs no sync. Returns offs."""
    offs = check_offsets(offs)
    check_same_device("offs", offs, like)
    check_host_offsets(offs, total, multiple)
    return offs


def check_host_offsets(offs: torch.Tensor, total: int, multiple: int = 1, name: str = "offs") -> None:
    """Check the values of ``offs`` where reading them costs no sync (CPU tensors, interpreter runs).

    They must be non-decreasing, within [0, total], and every group size a multiple of ``multiple``. CUDA offsets
    are never read on the host, so there the kernels trust them (see ``padding.group_bounds`` for what malformed
    ones do).
    """
    if offs.is_cuda:
        return
    prev = 0
    for g, end in enumerate(offs.tolist()):
        if not prev <= end <= total:
            raise InputError(f"{name} must be non-decreasing group ends within [0, {total}]; {name}[{g}] = {end}")
        if (end - prev) % multiple:
            raise InputError(f"{name}: group {g} holds {end - prev} rows, not a multiple of {multiple}")
        prev = end
