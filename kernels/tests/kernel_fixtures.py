"""The kernel tests' set-up: without a GPU, Triton kernels run on CPU tensors under the interpreter.

TRITON_INTERPRET must be set before any kernel is defined, so it is set here, on import, before test modules import
mxkernels. GPU-only tests carry the ``gpu`` marker and skip cleanly without CUDA. Both test trees use this module
(kernels/tests/conftest.py, and tests/conftest.py for the harness's tests).
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

if "OMP_NUM_THREADS" not in os.environ:
    # One intra-op thread, in this process and every process a test starts (they inherit the variable; torch read it
    # on import here, so this one is set directly). The suite's tensors are small and CI runs a worker per core:
    # torch's default (a thread per core) made each worker's OpenMP threads spin-wait for the core the other worker
    # held, about two thirds of a CPU check's time (`mxbench check --stage gemm_fwd,...`: 12.7 CPU s, 4.5 with one).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

POISON = 0xA5


def skip_gpu_tests(items) -> None:
    """Mark every ``gpu`` test skipped where there is no CUDA GPU."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
