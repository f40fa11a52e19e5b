"""``mxkernels.core.runtime``'s launch choices under the Triton interpreter."""

from dataclasses import replace

import pytest


@pytest.mark.parametrize("module, default, gpu", [
    ("quantize_cols", "INTERPRETER_COLS", "ALONG_N_COLS"), ("quantize", "INTERPRETER_ROWS", "ROWS_CONFIG")])
def test_the_interpreter_fits_only_its_own_default_launch_to_a_small_matrix(monkeypatch, module, default, gpu):
    """Under the interpreter the default 128 x 512 tile shrinks to a small matrix (powers of two, at least 32); a
    launch given explicitly, and every launch on a GPU (the tuned defaults), stay as they are."""
    import importlib

    from mxkernels.core import runtime

    interpreted, measured = (getattr(importlib.import_module(f"mxkernels.quant.{module}"), n) for n in (default, gpu))
    assert interpreted.tile == (128, 512)
    monkeypatch.setattr(runtime, "INTERPRET", True)  # on a GPU box too: what the interpreter would launch
    assert runtime.fit_interpreted(interpreted, interpreted, 32, 1).tile == (32, 32)
    assert runtime.fit_interpreted(interpreted, interpreted, 40, 100).tile == (64, 128)
    assert runtime.fit_interpreted(interpreted, interpreted, 4096, 4096) is interpreted
    explicit = replace(interpreted)  # equal, but not the default
    assert runtime.fit_interpreted(explicit, interpreted, 32, 1) is explicit
    assert runtime.fit_interpreted(measured, interpreted, 32, 1) is measured
    monkeypatch.setattr(runtime, "INTERPRET", False)
    assert runtime.fit_interpreted(interpreted, interpreted, 32, 1) is interpreted
