"""Specification of the fused-scale MXFP8 quantizers (``mxkernels.quant.quantize_blocked``).

Each must give the bytes of the reference quantizer followed by the reference rearrange: the data where the
contract specifies it (rows / columns up to offs[-1]) and every byte of the blocked buffer, its zero padding and
tail included (fresh allocations are poisoned, so a byte the launch never writes shows). Group sizes cover empty
groups (first, inside, last), sizes off the 128-row image boundaries and groups ending before the data does.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import offsets
from mxkernels.quant import quantize_blocked as QB
from mxkernels.core.cost import Cost
from mxkernels.layouts.scale_layout import k_groups_shape, m_groups_shape
from mxkernels.quant.quantize import ColsConfig, RowsConfig
from test_quantize import make_input

MODES = ["floor", "rceil"]


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.view(torch.uint8), want.view(torch.uint8)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    differ = (got != want).nonzero()
    assert differ.numel() == 0, f"{what}: {differ.shape[0]} bytes differ, first at {differ[:4].tolist()}"


# ---- dim0 with M-groups scales -----------------------------------------------------------------------------

# (group sizes, launch): each launch with one set of sizes, to keep the interpreter's runs short.
DIM0_CASES = [([0, 100, 0, 160, 27], None), ([300], RowsConfig((64, 64), 4)), ([32, 32, 0, 0], RowsConfig((128, 32), 2)),
              ([0], RowsConfig((16, 128), 1))]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(DIM0_CASES)))
def test_dim0_m_groups(device, mode, case, poisoned_empty):
    sizes, config = DIM0_CASES[case]
    dtype = torch.float32 if case == 1 else torch.bfloat16
    x = make_input(300, 160, dtype, seed=case, device=device)  # K / 32 = 5 scale columns: images padded to 8
    offs = offsets(sizes, device)
    q, s = QB.quantize_dim0_blocked(x, offs, mode, config=config)
    q_ref, s_ref = QB.quantize_dim0_blocked_reference(x, offs, mode)
    end = sum(sizes)
    assert_same(q[:end], q_ref[:end], "q")
    assert_same(s, s_ref, "scales")
    assert s.shape == m_groups_shape(300, 5, len(sizes)) and s.dtype == torch.float8_e8m0fnu


# ---- 3D weights, along K and along N -------------------------------------------------------------------------

ALONG_K_TILES = [None, RowsConfig((32, 64), 2), RowsConfig((128, 128), 4)]
ALONG_N_TILES = [
    None,
    ColsConfig((128, 32), 1, 1, 0),
    ColsConfig((128, 16), 1, 1, 32, scale_words=False),
    ColsConfig((256, 16), 2, 2, 0),  # two 4-block words per column
    ColsConfig((64, 16), 1, 1, 16, prefetch=True),
    ColsConfig((32, 64), 1, 1, 0),
]
# (3, 160, 96): 160 rows of an expert pad to 256 along K and N / 32 = 5 blocks to 8 along N, K = 96 to 128 image
# rows along N, 3 scale columns to 4 along K; (2, 256, 128) needs no padding (the unmasked path).
SHAPES_3D = [(3, 160, 96), (2, 256, 128)]


def weights(shape, along, seed, device):
    G, N, K = shape
    if along == "K":
        return make_input(G * N, K, torch.bfloat16, seed=seed, device=device).view(shape)
    # Blocks along N: the special blocks run down the columns of each expert.
    return make_input(G * K, N, torch.bfloat16, seed=seed, device=device).view(G, K, N).transpose(1, 2).contiguous()


@pytest.mark.parametrize("along, case", [("K", i) for i in range(len(ALONG_K_TILES))] +
                         [("N", i) for i in range(len(ALONG_N_TILES))])  # fmt: skip
def test_3d(device, along, case, poisoned_empty):
    config = (ALONG_K_TILES if along == "K" else ALONG_N_TILES)[case]
    mode = MODES[case % 2]
    for shape in SHAPES_3D if case == 0 else SHAPES_3D[case % 2 :][:1]:
        w = weights(shape, along, case, device)
        q, s = QB.quantize_3d_blocked(w, along, mode, config=config)
        q_ref, s_ref = QB.quantize_3d_blocked_reference(w, along, mode)
        assert_same(q, q_ref, f"q {shape}")
        assert_same(s, s_ref, f"scales {shape}")


# ---- dim1 with K-groups scales -------------------------------------------------------------------------------

DIM1_CASES = [([0, 64, 0, 96, 32, 0], None), ([320], ColsConfig((64, 16), 1, 1, 0)),
              ([32, 0, 224], ColsConfig((128, 32), 2, 2, 32)), ([0, 0], ColsConfig((32, 8), 1, 1, 16))]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(DIM1_CASES)))
def test_dim1_k_groups(device, mode, case, poisoned_empty):
    """(320, 40): 40 rows of the transposed output pad to an image of 128 rows; groups of 1, 2, 3 and 7 blocks pad
    their images to 4 and 8 columns; the tail after the last image is zero."""
    sizes, config = DIM1_CASES[case]
    x = make_input(40, 320, torch.bfloat16, seed=case, device=device).t().contiguous()  # (M, K) = (320, 40)
    offs = offsets(sizes, device)
    q, s = QB.quantize_dim1_blocked(x, offs, mode, config=config)
    q_ref, s_ref = QB.quantize_dim1_blocked_reference(x, offs, mode)
    end = sum(sizes)
    assert_same(q[:, :end], q_ref[:, :end], "q")
    assert_same(s, s_ref, "scales")
    assert s.shape == k_groups_shape(40, 10, len(sizes))


# ---- bad input, costs -----------------------------------------------------------------------------------------


def test_bad_input_names_the_argument(device):
    x = torch.zeros(64, 64, device=device)
    offs = offsets([32, 32], device)
    with pytest.raises(ValueError, match="at most 128 rows"):
        QB.quantize_dim0_blocked(x, offs, config=RowsConfig((256, 32), 4))
    with pytest.raises(ValueError, match="at most 128 rows"):
        QB.quantize_dim1_blocked(x, offs, config=ColsConfig((256, 32), 1, 1, 0))
    with pytest.raises(ValueError, match="offs must have dtype"):
        QB.quantize_dim0_blocked(x, offs.long())
    with pytest.raises(ValueError, match="K"):
        QB.quantize_dim0_blocked(torch.zeros(64, 48, device=device), offs)
    with pytest.raises(ValueError, match="M"):
        QB.quantize_dim1_blocked(torch.zeros(48, 64, device=device), offsets([48], device))
    with pytest.raises(ValueError, match="config"):
        QB.quantize_3d_blocked(x.view(1, 64, 64), "N", config=RowsConfig((32, 32), 1))
    if device == "cpu":  # CUDA offsets are never read on the host
        with pytest.raises(ValueError, match="multiple of 32"):
            QB.quantize_dim1_blocked(x, offsets([16, 48], device))


def test_costs_hand_counted():
    # DeepSeek-V3 A (131072, 7168) bf16, 8 groups: read 1_879_048_192; write 939_524_096 data + the M-groups buffer
    # 128 * (1024 + 8) rows x 224 = 29_589_504 (the unfused pair writes 29_360_128 scales and reads them back).
    assert QB.quantize_dim0_blocked_cost(131072, 7168, 8, torch.bfloat16) == Cost(1_879_048_192, 969_113_600)
    # dim1 of A: the K-groups buffer (7168, 4096 + 32).
    assert QB.quantize_dim1_blocked_cost(131072, 7168, 8, torch.bfloat16) == Cost(
        1_879_048_192, 939_524_096 + 7168 * 4128
    )
    # Weights (8, 2048, 7168): along K 8 images of (2048, 224); along N 8 of (7168, 64).
    assert QB.quantize_3d_blocked_cost(8, 2048, 7168, torch.bfloat16, "K") == Cost(234_881_024, 117_440_512 + 3_670_016)
    assert QB.quantize_3d_blocked_cost(8, 2048, 7168, torch.bfloat16, "N") == Cost(234_881_024, 117_440_512 + 3_670_016)
    # Padding counts: (1, 160, 96) along K is one image of (256, 4).
    assert QB.quantize_3d_blocked_cost(1, 160, 96, torch.float32, "K") == Cost(160 * 96 * 4, 160 * 96 + 256 * 4)


# ---- GPU: DeepSeek-V3 sizes -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_deepseek_v3_sizes():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16384, 7168, device="cuda", generator=gen).bfloat16()
    offs = offsets([2048, 0, 1024, 4096, 32, 3072, 2048, 4064], "cuda")
    for fused, reference in ((QB.quantize_dim0_blocked, QB.quantize_dim0_blocked_reference),
                             (QB.quantize_dim1_blocked, QB.quantize_dim1_blocked_reference)):  # fmt: skip
        q, s = fused(x, offs)
        q_ref, s_ref = reference(x, offs)
        assert_same(q, q_ref, fused.__name__)
        assert_same(s, s_ref, fused.__name__)
    w = torch.randn(8, 2048, 7168, device="cuda", generator=gen).bfloat16()
    for along in "KN":
        q, s = QB.quantize_3d_blocked(w, along)
        q_ref, s_ref = QB.quantize_3d_blocked_reference(w, along)
        assert_same(q, q_ref, f"3d {along}")
        assert_same(s, s_ref, f"3d {along}")
