"""The harness's test set-up: the kernel tests' (kernels/tests/kernel_fixtures.py: Triton under the interpreter
without a GPU, GPU tests skipped, the ``device`` and ``poisoned_empty`` fixtures) plus the harness's own fixtures.

kernel_fixtures must be imported before any test module imports mxkernels (it sets TRITON_INTERPRET), so first here.
"""

import importlib.metadata
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels" / "tests"))

import pytest  # noqa: E402
import torch  # noqa: E402
from kernel_fixtures import device, poisoned_empty, skip_gpu_tests  # noqa: E402, F401


SLOWEST_FIRST = (
    "tests/test_readme.py::test_each_cpu_command_of_the_readme_runs_as_written[mxbench check --layer",
    "tests/test_cli_registry.py::test_a_plain_check_on_a_clean_cpu_install_exits_0",
    "tests/test_ep.py::test_eight_processes_check_that_world_sizes_paths",
    # the README's two-process EP checks, which test_ep and test_ep_layer read too (readme_runs.py)
    "tests/test_readme.py::test_each_cpu_command_of_the_readme_runs_as_written[mxbench ep --layer --nproc 2 --check",
    "tests/test_ep_layer.py::test_three_processes_check",
    "tests/test_layer.py::test_fused_layer_is_bit_identical_to_the_chains",
    "tests/test_b200_first_run.py::test_the_first_run_commands_pass",
    "tests/test_ep_multinode.py::test_two_launchers",
    "tests/test_readme.py::test_each_cpu_command_of_the_readme_runs_as_written[mxbench ep --nproc 2 --check",
)
"""Tests of 10 s to a minute on CI's two cores (`--durations`), run first: pytest-xdist hands tests out in collection
order, and one of these drawn last keeps a worker busy while the other has nothing left (no module-scoped fixtures
among them, so moving them sets nothing up twice)."""


def _slowness_rank(item) -> int:
    return next((i for i, prefix in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(prefix)), len(SLOWEST_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_slowness_rank)  # stable: the rest keep their order
    skip_gpu_tests(items)


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
def stored(tmp_path):
    """``stored(name, run)``: ``run`` saved as ``<tmp_path>/<name>.json`` (and its CSV); returns the JSON's path."""
    from mxbench.storage.results import save_run

    def store(name: str, run):
        path = tmp_path / f"{name}.json"
        save_run(run, path)
        return path

    return store


@pytest.fixture(scope="session")
def readme_run(tmp_path_factory):
    """``readme_run(line)``: the README's CPU command ``line`` run as a user types it, once per session
    (readme_runs.py): the xdist workers share the session's folder, the parent of each one's own."""
    from readme_runs import session_runner

    root = tmp_path_factory.getbasetemp()
    return session_runner((root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "readme-runs")


@pytest.fixture
def world_of_one():
    """A gloo group of this process alone: EP degree 1 (the all-to-alls copy locally)."""
    import torch.distributed as dist

    from mxbench.measuring.dist import Context

    if not os.environ.get("TRITON_INTERPRET"):
        # this path runs the kernels on CPU tensors; a GPU box checks it through the worker subprocesses
        pytest.skip("the in-process gloo path needs the Triton interpreter (CPU tensors)")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Context(0, 1, 0, "gloo", torch.device("cpu"), dist.group.WORLD)
    dist.destroy_process_group()
