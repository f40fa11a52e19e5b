"""The kernel tests run alone (``cd kernels && pytest``) or with the harness's (``make test``): their set-up is
kernel_fixtures.py, imported before mxkernels. The fixtures below serve the grouped GEMMs' tests (test_gemm_*.py)."""

import pytest
import torch
from kernel_fixtures import device, poisoned_empty, skip_gpu_tests  # noqa: F401
from mxkernels.gemm import native as gemm_native  # after kernel_fixtures, which sets TRITON_INTERPRET


def pytest_collection_modifyitems(config, items):
    skip_gpu_tests(items)


@pytest.fixture
def native_probe_passes(monkeypatch):
    """On 10.x native MXFP8 is available only once its probe at first use passed (no B200 here: say it did)."""
    monkeypatch.setattr(gemm_native, "probe_mxfp8", lambda _device: gemm_native.Verdict(True, "passed (said so)"))
    monkeypatch.setattr(gemm_native, "_PROBES", {})


@pytest.fixture
def no_torch_scaled_grouped_mm(monkeypatch):
    """Fail if anything reaches torch._scaled_grouped_mm: refusals must come before any launch."""

    def launched(*args, **kwargs):
        raise AssertionError("torch._scaled_grouped_mm was called")

    monkeypatch.setattr(torch, "_scaled_grouped_mm", launched)


@pytest.fixture
def exact_fp32_matmul(monkeypatch):
    """The fp32 references must not run on TF32 tensor cores."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
