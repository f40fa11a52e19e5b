"""Test set-up: without a GPU, Triton kernels run on CPU tensors under the interpreter.

TRITON_INTERPRET must be set before any kernel is defined, so it is set here, before test modules import
mxkernels. GPU-only tests carry the ``gpu`` marker and skip cleanly without CUDA.
"""

import importlib.metadata
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

POISON = 0xA5


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


PLUGIN_GROUP = "mxbench.implementations"


def _plugin_key(ep) -> tuple:
    """An entry point and where its distribution is installed (the same plugin in a test's own site folder differs)."""
    return ep.name, ep.value, str(getattr(ep.dist, "_path", ""))


INSTALLED_PLUGINS = frozenset(map(_plugin_key, importlib.metadata.entry_points(group=PLUGIN_GROUP)))
"""The plugins installed in this environment before the suite ran (the README's `pip install examples/plain_quantizer`
puts one there): a user's, not the suite's."""


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch):
    """The suite sees only the implementations its tests register: a plugin the user installed adds rows to every
    listing of the registry. Entry points of the site folders a test puts on sys.path still load."""
    real = importlib.metadata.entry_points

    def entry_points(**params):
        found = real(**params)
        if params.get("group") != PLUGIN_GROUP:
            return found
        return importlib.metadata.EntryPoints(ep for ep in found if _plugin_key(ep) not in INSTALLED_PLUGINS)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.fixture
def device() -> str:
    """Where kernels run in CPU-or-GPU tests: the GPU when there is one, else CPU under the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Make every fresh ``torch.empty`` allocation hold POISON bytes, so an output byte that a kernel never writes
    shows up (on CPU, torch.empty often hands back pages that are already zero)."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.numel():
            t.view(-1).view(torch.uint8).fill_(POISON)
        return t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture
def stored(tmp_path):
    """``stored(name, run)``: ``run`` saved as ``<tmp_path>/<name>.json`` (and its CSV); returns the JSON's path."""
    from mxbench.results import save_run

    def store(name: str, run):
        path = tmp_path / f"{name}.json"
        save_run(run, path)
        return path

    return store


@pytest.fixture
def world_of_one():
    """A gloo group of this process alone: EP degree 1 (the all-to-alls copy locally)."""
    import torch.distributed as dist

    from mxbench.ep.dist import Context

    if not os.environ.get("TRITON_INTERPRET"):
        # this path runs the kernels on CPU tensors; a GPU box checks it through the worker subprocesses
        pytest.skip("the in-process gloo path needs the Triton interpreter (CPU tensors)")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Context(0, 1, 0, "gloo", torch.device("cpu"), dist.group.WORLD)
    dist.destroy_process_group()
