"""mxbench: benchmarking and roofline suite for MXFP8 MoE grouped-GEMM training kernels.

``mxbench.load(paths_or_folders)`` reads stored runs as a pandas DataFrame (one row per record) and
``mxbench.load_samples`` as one row per timing sample; see ``mxbench.views.frame``. ``mxbench.register(stage, fn,
name=...)`` and the ``@mxbench.implementation(stage, name=...)`` decorator add an implementation to the process-wide
registry (``mxbench.implementations.default``).
"""

from .version import __version__

__all__ = ["__version__"]

_FRAME_NAMES = ("load", "load_samples")
_REGISTRY_NAMES = ("register", "implementation")


def __getattr__(name: str):
    # loaded on first use: pandas, torch and the tables stay out of `import mxbench` (the CLI's --help stays fast)
    if name in _FRAME_NAMES:
        from .views import frame

        return getattr(frame, name)
    if name in _REGISTRY_NAMES:
        from .implementations import default

        return getattr(default, name)
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # a submodule or folder (mxbench.instruments, mxbench.views): loaded on first use
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mxbench' has no attribute {name!r}")
