"""Plain helpers shared by the kernel tests (pytest puts kernels/tests/ on sys.path: ``from kernel_helpers import
...``) and by the harness's tests (tests/conftest.py puts this folder on sys.path too). Fixtures live in
kernel_fixtures.py."""

from __future__ import annotations

import itertools

import torch


def f32(bits: int) -> float:
    """The fp32 value with the given bit pattern."""
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32).item()


def offsets(sizes, device="cpu"):
    """int32 (G,) cumulative group ends of the given group sizes."""
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)


def random_group_ends(rng, total, G, multiple=1, empty=(), end=None):
    """int32 (G,) group ends whose sizes are multiples of ``multiple`` and sum to ``end`` (default ``total``), the
    groups listed in ``empty`` empty and the others of random (possibly zero) size."""
    end = total if end is None else end
    units = end // multiple
    filled = [g for g in range(G) if g not in empty]
    cuts = sorted(rng.randint(0, units) for _ in range(len(filled) - 1)) + [units] if filled else []
    sizes, prev = [0] * G, 0
    for g, cut in zip(filled, cuts):
        sizes[g], prev = (cut - prev) * multiple, cut
    ends, acc = [], 0
    for s in sizes:
        acc += s
        ends.append(acc)
    return torch.tensor(ends, dtype=torch.int32)


def capture(fn):
    """``fn``'s result tensor and a CUDA graph that recomputes it in place (warmed up on a side stream first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return out, graph


def bits_of(x: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor as the signed integer type of its width."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(bits_of(actual), bits_of(expected))


def assert_nearly_exact(actual: torch.Tensor, expected: torch.Tensor, min_exact: float = 0.999) -> None:
    """bf16 outputs equal bit for bit on at least ``min_exact`` of the elements, the others one ulp apart with the
    same sign (what an exp or FMA that differs in its last bit can do to one rounding). A NaN matches any NaN: torch
    writes 0xFFFF on a CPU, 0x7FFF on a GPU, the kernels the quiet NaN of the fp32 bits."""
    assert actual.dtype == expected.dtype == torch.bfloat16 and actual.shape == expected.shape
    a, b = bits_of(actual).int(), bits_of(expected).int()
    same = (a == b) | (actual.isnan() & expected.isnan())
    if actual.numel():
        assert same.float().mean().item() >= min_exact, f"only {same.float().mean().item():.5f} bit-exact"
    off = ~same
    assert torch.all(((a[off] - b[off]).abs() == 1) & ((a[off] < 0) == (b[off] < 0))), "a difference beyond 1 ulp"
