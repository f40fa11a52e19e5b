"""The process-wide registry: the built-in implementations (``builtin``) and the installed packages' entry points,
loaded once; ``register`` and the ``@implementation`` decorator add to it (``mxbench.register`` hands them on).

Apart from ``registry`` (what an implementation and a registry are) so that the built-in implementations, which are
registered exactly as a third party's, import the registry's types without the registry importing them back.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable

from ..instruments.guarded import one_line
from . import builtin
from .registry import ENTRY_POINT_GROUP, Registry


def load_entry_points(registry: Registry, group: str = ENTRY_POINT_GROUP) -> None:
    """Call every ``register(registry)`` function the installed packages declare in ``group``. One that fails to
    load or register (any exception, ``SystemExit`` included) is noted in ``registry.load_errors``: the other
    implementations still run, and the commands report it as a failure."""
    for ep in importlib.metadata.entry_points(group=group):
        origin = f"entry point {ep.name} ({ep.value})"
        before = set(registry.impls)
        try:
            target = ep.load()
            if callable(target):
                target(registry)
            for key in set(registry.impls) - before:  # say where each came from
                registry.impls[key] = dataclasses.replace(registry.impls[key], origin=f"entry point {ep.name}")
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 -- a broken plugin (one exiting at import too) is reported, not fatal
            registry.load_errors.append((origin, one_line(e)))


def builtin_registry() -> Registry:
    """mxkernels, torchao and torch.compile of the references."""
    registry = Registry()
    builtin.register_all(registry)
    return registry


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry: the built-in implementations and the installed entry points, loaded once.
    ``register`` / ``implementation`` add to it."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = builtin_registry()
        load_entry_points(_DEFAULT)
    return _DEFAULT


def register(stage: str, fn: Callable[..., tuple] | None = None, **kwargs):
    """``default_registry().register(...)``: see ``Registry.register``."""
    return default_registry().register(stage, fn, **kwargs)


def implementation(stage: str, **kwargs):
    """Decorator form of ``register``: ``@implementation("quantize_a", name="mine")``."""
    return default_registry().register(stage, None, **kwargs)
