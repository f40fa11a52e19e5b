"""Token-group padding: the references against hand-worked cases, the Triton kernels bit-identical to them
(interpreter on CPU, DeepSeek-V3 sizes and CUDA graphs on a GPU), the round trip, argument checks and costs."""

import random
from dataclasses import replace

import pytest
import torch
from kernel_helpers import capture, random_group_ends
from mxkernels.core.cost import Cost
from mxkernels.layouts.padding import (
    default_pad_config,
    pad_cost,
    pad_token_groups,
    pad_token_groups_reference,
    unpad_cost,
    unpad_token_groups,
    unpad_token_groups_reference,
)

ALIGNMENTS = (16, 32, 128)


def values(M, D, dtype, seed=0, device="cpu"):
    """Random nonzero values of ``dtype`` (a zero in an output is then padding, never data)."""
    g = torch.Generator(device).manual_seed(seed)
    magnitude = torch.rand(M, D, generator=g, device=device) + 0.5
    sign = torch.where(torch.rand(M, D, generator=g, device=device) < 0.5, -1.0, 1.0)
    return (magnitude * sign).to(dtype)


def launch(D, **fields):
    """The default launch for bf16 rows of D elements with the given fields replaced (None: keep the default)."""
    return replace(default_pad_config(D, 2), **{k: v for k, v in fields.items() if v is not None})


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    assert torch.equal(actual.view(bits), expected.view(bits))


class TestReferences:
    def test_hand_case(self):
        # 5 rows in groups of 2, 0 and 3, alignment 16: slots of 16, 0 and 16 rows in ceil16(5 + 48) = 64 rows
        x = torch.arange(1.0, 11.0).view(5, 2)
        offs = torch.tensor([2, 2, 5], dtype=torch.int32)
        padded, padded_offs = pad_token_groups_reference(x, offs, alignment=16)
        assert padded.shape == (64, 2)
        assert padded_offs.tolist() == [16, 16, 32] and padded_offs.dtype == torch.int32
        expected = torch.zeros(64, 2)
        expected[0:2] = x[0:2]
        expected[16:19] = x[2:5]
        assert torch.equal(padded, expected)
        assert torch.equal(unpad_token_groups_reference(padded, offs, padded_offs, 5), x)

    def test_rows_past_the_last_group_are_dropped_and_come_back_zero(self):
        x = torch.arange(1.0, 9.0).view(4, 2)
        offs = torch.tensor([1, 3], dtype=torch.int32)
        padded, padded_offs = pad_token_groups_reference(x, offs, alignment=32)
        assert padded.shape == (96, 2) and padded_offs.tolist() == [32, 64]
        assert torch.equal(padded[32:34], x[1:3]) and int((padded != 0).sum()) == 6
        back = unpad_token_groups_reference(padded, offs, padded_offs, 4)
        assert torch.equal(back[:3], x[:3]) and not back[3].any()


def pad_cases():
    """(M, D, G, empty groups, end of the last group, block_rows (capped at the alignment), block_cols)."""
    return [
        (50, 40, 1, (), None, 16, None),
        (100, 24, 3, (1,), None, 16, 8),  # several column programs
        (77, 5, 7, (0, 6), None, 16, None),  # non-power-of-two D and G; empty first and last groups
        (150, 16, 40, (0, 20, 39), None, 128, None),  # big blocks: 40 slots of 128 rows interpret slowly
        (90, 8, 4, (), 60, 16, None),  # rows past offs[-1]
        (0, 8, 2, (), None, 16, None),
    ]


@pytest.mark.usefixtures("poisoned_empty")
class TestKernelsMatchReferences:
    @pytest.mark.parametrize("case", pad_cases())
    @pytest.mark.parametrize("alignment", ALIGNMENTS)
    def test_pad_and_unpad(self, case, alignment, device):
        M, D, G, empty, end, block_rows, block_cols = case
        rng = random.Random(M + G + alignment)
        x = values(M, D, torch.bfloat16, seed=G, device=device)
        offs = random_group_ends(rng, M, G, empty=empty, end=end).to(device)
        block_rows = min(block_rows, alignment)
        padded, padded_offs = pad_token_groups(
            x, offs, alignment, config=launch(D, block_rows=block_rows, block_cols=block_cols)
        )
        expected, expected_offs = pad_token_groups_reference(x, offs, alignment)
        assert_bits_equal(padded, expected)
        assert torch.equal(padded_offs, expected_offs)
        back = unpad_token_groups(padded, offs, padded_offs, M, config=launch(D, block_cols=block_cols))
        assert_bits_equal(back, unpad_token_groups_reference(expected, offs, expected_offs, M))
        if end is None:
            assert_bits_equal(back, x)  # the exact inverse when the groups cover every row

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float8_e4m3fn, torch.float64])
    def test_any_float_dtype_is_copied_bit_exactly(self, dtype, device):
        x = values(70, 12, dtype, seed=1, device=device)
        offs = torch.tensor([0, 33, 70], dtype=torch.int32, device=device)
        padded, padded_offs = pad_token_groups(x, offs, 16)
        assert_bits_equal(padded, pad_token_groups_reference(x, offs, 16)[0])
        assert_bits_equal(unpad_token_groups(padded, offs, padded_offs, 70), x)

    @pytest.mark.parametrize("block_rows", [1, 4, 16])
    def test_block_rows(self, block_rows, device):
        x = values(20, 10, torch.bfloat16, seed=2, device=device)
        offs = torch.tensor([7, 7, 20], dtype=torch.int32, device=device)
        padded, padded_offs = pad_token_groups(x, offs, 16, config=launch(10, block_rows=block_rows))
        assert_bits_equal(padded, pad_token_groups_reference(x, offs, 16)[0])
        assert_bits_equal(
            unpad_token_groups(padded, offs, padded_offs, 20, config=launch(10, block_rows=block_rows)), x
        )

    def test_zero_width_rows_still_give_padded_offs(self, device):
        offs = torch.tensor([3, 3, 40], dtype=torch.int32, device=device)
        padded, padded_offs = pad_token_groups(torch.zeros(40, 0, device=device), offs, 32)
        assert padded.shape == (160, 0) and padded_offs.tolist() == [32, 32, 96]


class TestArguments:
    def test_alignment(self, device):
        x = values(8, 4, torch.bfloat16, device=device)
        offs = torch.tensor([8], dtype=torch.int32, device=device)
        for bad in (64, 8, 0):
            with pytest.raises(ValueError, match="alignment"):
                pad_token_groups(x, offs, bad)
        with pytest.raises(ValueError, match="alignment"):
            pad_cost(8, 4, 1, 64, 2)

    def test_bad_x(self, device):
        offs = torch.tensor([8], dtype=torch.int32, device=device)
        for bad in (torch.zeros(8, 4, dtype=torch.int32), torch.zeros(8), torch.zeros(4, 8).t()):
            with pytest.raises(ValueError, match="x"):
                pad_token_groups(bad.to(device), offs)

    def test_bad_offs(self, device):
        x = values(8, 4, torch.bfloat16, device=device)
        for bad in (torch.tensor([8], dtype=torch.int64), torch.zeros(0, dtype=torch.int32)):
            with pytest.raises(ValueError, match="offs"):
                pad_token_groups(x, bad.to(device))

    @pytest.mark.skipif(torch.cuda.is_available(), reason="offs values are read on the host only for CPU tensors")
    def test_host_readable_offs_are_checked(self):
        x = values(8, 4, torch.bfloat16)
        for bad in ([5, 3], [9], [-1, 8]):
            with pytest.raises(ValueError, match="offs"):
                pad_token_groups(x, torch.tensor(bad, dtype=torch.int32))

    def test_block_sizes(self, device):
        x = values(8, 4, torch.bfloat16, device=device)
        offs = torch.tensor([8], dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match="block_rows"):
            pad_token_groups(x, offs, 16, config=launch(4, block_rows=32))  # must divide the alignment
        with pytest.raises(ValueError, match="block_rows"):
            pad_token_groups(x, offs, 16, config=launch(4, block_rows=3))
        with pytest.raises(ValueError, match="block_cols"):
            pad_token_groups(x, offs, 16, config=launch(4, block_cols=12))

    def test_unpad_arguments(self, device):
        x = values(8, 4, torch.bfloat16, device=device)
        offs = torch.tensor([3, 8], dtype=torch.int32, device=device)
        padded, padded_offs = pad_token_groups(x, offs, 16)
        with pytest.raises(ValueError, match="padded_offs"):
            unpad_token_groups(padded, offs, padded_offs[:1], 8)
        with pytest.raises(ValueError, match="num_tokens"):
            unpad_token_groups(padded, offs, padded_offs, -1)
        with pytest.raises(ValueError, match="padded"):
            unpad_token_groups(padded[:, 0], offs, padded_offs, 8)


class TestCosts:
    def test_pad(self):
        # DeepSeek-V3 A: (131072, 7168) bf16 in 8 groups at alignment 32 -> ceil32(131072 + 256) = 131328 rows
        assert pad_cost(131072, 7168, 8, 32, 2) == Cost(131072 * 7168 * 2 + 32, 131328 * 7168 * 2 + 32)
        # 100 rows of 64 bf16 in 3 groups: read 12800 + 12 bytes of offs; write ceil32(196) = 224 rows + padded_offs
        assert pad_cost(100, 64, 3, 32, 2) == Cost(12812, 224 * 128 + 12)
        # groups covering only 90 of the rows: 90 rows read, the same buffer written
        assert pad_cost(100, 64, 3, 32, 2, group_sizes=[40, 0, 50]) == Cost(90 * 128 + 12, 224 * 128 + 12)
        # alignment 128, fp32: ceil128(10 + 256) = 384 rows
        assert pad_cost(10, 3, 2, 128, 4) == Cost(120 + 8, 384 * 12 + 8)
        with pytest.raises(ValueError, match="group_sizes"):
            pad_cost(100, 64, 3, 32, 2, group_sizes=[50, 60])

    def test_unpad(self):
        # reads the 100 data rows (never the padding) plus offs and padded_offs; writes 100 rows
        assert unpad_cost(100, 64, 3, 32, 2) == Cost(12800 + 24, 12800)
        assert unpad_cost(100, 64, 3, 16, 2, group_sizes=[40, 0, 50]) == Cost(90 * 128 + 24, 12800)

    def test_cost_counts_the_buffer_the_kernel_returns(self):
        x = values(100, 64, torch.bfloat16)
        padded, _ = pad_token_groups_reference(x, torch.tensor([50, 50, 100], dtype=torch.int32), 32)
        assert pad_cost(100, 64, 3, 32, 2).bytes_written == padded.numel() * 2 + 3 * 4


# ---- GPU: DeepSeek-V3 sizes and CUDA graphs ---------------------------------------------------------------------

DSV3_M, DSV3_K, DSV3_G = 131072, 7168, 8


def dsv3_offs(seed):
    """8 unaligned groups (one empty) covering all the tokens."""
    return random_group_ends(random.Random(seed), DSV3_M, DSV3_G, empty=(5,)).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_dsv3_pad_round_trip(alignment):
    x = values(DSV3_M, DSV3_K, torch.bfloat16, device="cuda")
    offs = dsv3_offs(seed=1)
    padded, padded_offs = pad_token_groups(x, offs, alignment)
    expected, expected_offs = pad_token_groups_reference(x, offs, alignment)
    assert_bits_equal(padded, expected)
    assert torch.equal(padded_offs, expected_offs)
    del expected
    assert_bits_equal(unpad_token_groups(padded, offs, padded_offs, DSV3_M), x)


@pytest.mark.gpu
def test_pad_and_unpad_replay_in_a_cuda_graph_with_new_offsets():
    x = values(DSV3_M // 8, DSV3_K, torch.bfloat16, device="cuda")
    offs = random_group_ends(random.Random(1), x.shape[0], DSV3_G).cuda()

    def step():
        padded, padded_offs = pad_token_groups(x, offs, 32)
        return padded, padded_offs, unpad_token_groups(padded, offs, padded_offs, x.shape[0])

    (padded, padded_offs, back), graph = capture(step)
    for seed in (2, 3):
        offs.copy_(random_group_ends(random.Random(seed), x.shape[0], DSV3_G, empty=(seed,)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        expected, expected_offs = pad_token_groups_reference(x, offs, 32)
        assert_bits_equal(padded, expected)
        assert torch.equal(padded_offs, expected_offs)
        assert_bits_equal(back, x)
