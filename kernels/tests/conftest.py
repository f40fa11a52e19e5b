"""The kernel tests run alone (``cd kernels && pytest``) or with the harness's (``make test``): their set-up is
kernel_fixtures.py, imported first."""

from kernel_fixtures import device, poisoned_empty, skip_gpu_tests  # noqa: F401


def pytest_collection_modifyitems(config, items):
    skip_gpu_tests(items)
