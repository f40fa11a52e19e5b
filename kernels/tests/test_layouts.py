"""Blocked scale layouts: the references against the layout formula and hand-worked cases, the Triton kernels
bit-identical to the references (interpreter on CPU, DeepSeek-V3 sizes and CUDA graphs on a GPU), and the costs."""

import random

import pytest
import torch
from crosscompile import compile_ptx
from kernel_helpers import capture, random_group_ends
from mxkernels.layouts import scale_layout
from mxkernels.core.format import SCALE_DTYPE
from mxkernels.layouts.scale_layout import (
    RearrangeConfig,
    from_blocked,
    rearrange_3d,
    rearrange_3d_cost,
    rearrange_3d_reference,
    rearrange_k_groups,
    rearrange_k_groups_cost,
    rearrange_k_groups_reference,
    rearrange_m_groups,
    rearrange_m_groups_cost,
    rearrange_m_groups_reference,
    to_blocked,
)


def scale_bytes(*shape, seed=0, device="cpu"):
    """Random e8m0 scales with no zero byte, so a zero in an output is padding and never data."""
    g = torch.Generator(device).manual_seed(seed)
    return torch.randint(1, 256, shape, dtype=torch.uint8, generator=g, device=device).view(SCALE_DTYPE)


def launch(block_cols):
    """The launch with ``block_cols`` scale columns per program (None: the kernel's default)."""
    return None if block_cols is None else RearrangeConfig(block_cols)


def column_major(s):
    """The same values as ``s`` (R, C) stored column-major: stride (1, R)."""
    return s.t().contiguous().t()


def blocked_by_formula(s):
    """The blocked image of ``s`` (R, C) as flat bytes, each element placed by the spec's formula: tile
    (r // 128) * (C' / 4) + c // 4, byte (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4 inside it."""
    R, C = s.shape
    Rp, Cp = -(-R // 128) * 128, -(-C // 4) * 4
    r = torch.arange(R).view(R, 1)
    c = torch.arange(C).view(1, C)
    tile = (r // 128) * (Cp // 4) + c // 4
    index = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out = torch.zeros(Rp * Cp, dtype=torch.uint8)
    out[index.reshape(-1)] = s.view(torch.uint8).cpu().reshape(-1)
    return out


def assert_bytes_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.view(torch.uint8), expected.view(torch.uint8)
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        raise AssertionError(f"{bad.shape[0]} bytes differ, first at {bad[0].tolist()}: {a[tuple(bad[0])]} vs "
                             f"{e[tuple(bad[0])]}")  # fmt: skip


def assert_only_group_data(out, s_groups):
    """Independent of any reference: the nonzero bytes of ``out`` are exactly the (all nonzero) scale bytes of the
    groups, so every byte outside the images' data is zero."""
    data = torch.cat([g.reshape(-1).view(torch.uint8).cpu() for g in s_groups])
    flat = out.view(torch.uint8).reshape(-1).cpu()
    nonzero = flat[flat != 0]
    assert nonzero.numel() == data.numel()
    assert torch.equal(nonzero.sort().values, data.sort().values)


class TestBlockedReference:
    def test_130_by_5_elements_land_where_the_formula_says(self):
        s = scale_bytes(130, 5)
        b = to_blocked(s).view(torch.uint8)
        assert b.shape == (256, 8)
        flat, u = b.reshape(-1), s.view(torch.uint8)
        # worked by hand: C' = 8, so 2 tiles per row block; (r, c) -> tile*512 + (r%32)*16 + (r%128//32)*4 + c%4
        assert flat[0] == u[0, 0]
        assert flat[16] == u[1, 0]  # next row: next 16-byte line
        assert flat[4] == u[32, 0]  # row 32: second 4-byte group of line 0
        assert flat[3] == u[0, 3]
        assert flat[499] == u[31, 3]  # 31*16 + 3
        assert flat[508] == u[127, 0]  # 31*16 + 3*4
        assert flat[512] == u[0, 4]  # column 4: tile 1
        assert flat[1024] == u[128, 0]  # row 128: tile 2 (second row block)
        assert flat[1552] == u[129, 4]  # tile 3, 1*16
        assert torch.equal(flat, blocked_by_formula(s))
        assert int((flat != 0).sum()) == 130 * 5  # every other byte is padding

    def test_from_blocked_inverts_to_blocked(self):
        s = scale_bytes(200, 7)
        assert_bytes_equal(from_blocked(to_blocked(s), 200, 7), s)

    def test_m_groups_hand_case(self):
        # M = 130, C = 5, groups of 3, 0 and 127 rows: images of 128, 0 and 128 rows in a 128*(2+3) x 8 buffer
        s = scale_bytes(130, 5)
        out = rearrange_m_groups_reference(s, torch.tensor([3, 3, 130], dtype=torch.int32))
        assert out.shape == (640, 8) and out.dtype == SCALE_DTYPE
        flat, u = out.view(torch.uint8).reshape(-1), s.view(torch.uint8)
        assert flat[2 * 16 + 4] == 0  # where row 34 would go: group 0 has 3 rows
        assert flat[2 * 16 + 1] == u[2, 1]
        assert flat[512 + 2 * 16] == u[2, 4]
        # group 2 starts at row 128 = byte 1024; its local row 126 is global row 129
        assert flat[1024] == u[3, 0]
        assert flat[1024 + 512 + 30 * 16 + 3 * 4] == u[129, 4]
        assert not flat[2048:].any()
        assert_only_group_data(out, [s[:3], s[3:130]])

    def test_k_groups_hand_case(self):
        # R = 3, 96 tokens = 3 scale columns; groups of 32 and 64 tokens = 1 and 2 columns, each padded to 4:
        # a (128, 3 + 4*2) buffer = 1408 bytes, group 0's image at byte 0, group 1's at 128*4 = 512
        s = scale_bytes(3, 3)
        offs = torch.tensor([32, 96], dtype=torch.int32)
        u = s.view(torch.uint8)
        for layout in (s, column_major(s)):
            out = rearrange_k_groups_reference(layout, offs)
            assert out.shape == (128, 11) and out.dtype == SCALE_DTYPE
            flat = out.view(torch.uint8).reshape(-1)
            expected = torch.zeros(1408, dtype=torch.uint8)
            for r in range(3):
                expected[r * 16] = u[r, 0]
                expected[512 + r * 16 + 0] = u[r, 1]
                expected[512 + r * 16 + 1] = u[r, 2]
            assert torch.equal(flat, expected)

    def test_3d_hand_case(self):
        s = scale_bytes(2, 3, 2)
        out = rearrange_3d_reference(s)
        assert out.shape == (2, 128, 4)
        flat = out.view(torch.uint8).reshape(-1)
        assert flat[512 + 2 * 16 + 1] == s.view(torch.uint8)[1, 2, 1]
        assert_only_group_data(out, [s])

    @pytest.mark.parametrize("seed", range(3))
    def test_group_references_match_the_formula(self, seed):
        rng = random.Random(seed)
        G, M, R = rng.randint(1, 9), rng.randint(0, 400), rng.randint(1, 260)
        s = scale_bytes(M, 6, seed=seed)
        offs = random_group_ends(rng, M, G, empty=rng.sample(range(G), G // 3))
        out = rearrange_m_groups_reference(s, offs).view(torch.uint8).reshape(-1)
        pos, start = 0, 0
        for end in offs.tolist():
            image = blocked_by_formula(s[start:end])
            assert torch.equal(out[pos : pos + image.numel()], image)
            pos, start = pos + image.numel(), end
        assert not out[pos:].any()

        s = scale_bytes(R, M // 32, seed=seed)
        offs = random_group_ends(rng, (M // 32) * 32, G, multiple=32)
        out = rearrange_k_groups_reference(s, offs).view(torch.uint8).reshape(-1)
        pos, start = 0, 0
        for end in offs.tolist():
            image = blocked_by_formula(s[:, start // 32 : end // 32])
            assert torch.equal(out[pos : pos + image.numel()], image)
            pos, start = pos + image.numel(), end
        assert not out[pos:].any()


def m_groups_cases():
    """(M, C, G, empty groups, end of the last group, block_cols): sizes are random and unaligned."""
    return [
        (300, 5, 3, (), None, 64),
        (300, 7, 4, (0,), None, 4),  # C > block_cols: several column programs
        (257, 13, 5, (2,), 200, 8),  # rows past offs[-1] belong to no group
        (600, 3, 17, (0, 8, 16), None, 64),
        (900, 4, 40, (0, 19, 39), None, 64),
        (0, 5, 2, (), None, 64),
        (130, 1, 1, (), None, 4),
        (260, 200, 3, (1,), None, None),  # the default: whole rows (256 columns, 200 valid) per program
    ]


def k_groups_cases():
    """(R, tokens, G, empty groups, end of the last group, block_cols); tokens and group sizes multiples of 32."""
    return [
        (3, 96, 2, (), None, 64),
        (130, 32 * 37, 5, (1,), None, 8),
        (200, 32 * 20, 3, (0, 2), None, 4),
        (1, 32 * 90, 13, (0, 6, 12), None, 16),
        (64, 32 * 50, 40, (0, 20, 39), None, 4),
        (129, 32 * 40, 6, (), 32 * 25, 8),  # tokens past offs[-1]: a longer zero tail
        (5, 0, 3, (), None, 4),
    ]


@pytest.mark.usefixtures("poisoned_empty")
class TestKernelsMatchReferences:
    @pytest.mark.parametrize("case", m_groups_cases())
    def test_m_groups(self, case, device):
        M, C, G, empty, end, block_cols = case
        rng = random.Random(M * 1000 + G)
        s = scale_bytes(M, C, seed=G, device=device)
        offs = random_group_ends(rng, M, G, empty=empty, end=end).to(device)
        out = rearrange_m_groups(s, offs, config=launch(block_cols))
        assert_bytes_equal(out, rearrange_m_groups_reference(s, offs))
        starts = [0] + offs.tolist()[:-1]
        assert_only_group_data(out, [s[a:b] for a, b in zip(starts, offs.tolist())])

    def test_m_groups_strided_uint8_input(self, device):
        s = scale_bytes(9, 150, seed=3, device=device).view(torch.uint8).t()  # (150, 9), stride (1, 150)
        offs = torch.tensor([50, 50, 149], dtype=torch.int32, device=device)
        out = rearrange_m_groups(s, offs)
        assert out.dtype == torch.uint8
        assert_bytes_equal(out, rearrange_m_groups_reference(s, offs))

    @pytest.mark.parametrize("case", k_groups_cases())
    @pytest.mark.parametrize("order", ["row", "col"])
    def test_k_groups(self, case, order, device):
        R, tokens, G, empty, end, block_cols = case
        rng = random.Random(R * 1000 + G)
        s = scale_bytes(R, tokens // 32, seed=G, device=device)
        s = column_major(s) if order == "col" else s
        offs = random_group_ends(rng, tokens, G, multiple=32, empty=empty, end=end).to(device)
        out = rearrange_k_groups(s, offs, config=launch(block_cols))
        assert_bytes_equal(out, rearrange_k_groups_reference(s, offs))
        starts = [0] + offs.tolist()[:-1]
        assert_only_group_data(out, [s[:, a // 32 : b // 32] for a, b in zip(starts, offs.tolist())])

    @pytest.mark.parametrize(
        "shape, block_cols",
        [((1, 1, 1), 4), ((3, 130, 5), 4), ((2, 7, 70), 64), ((4, 200, 13), 8), ((2, 130, 90), None)],
    )
    def test_3d(self, shape, block_cols, device):
        s = scale_bytes(*shape, seed=sum(shape), device=device)
        out = rearrange_3d(s, config=launch(block_cols))
        assert_bytes_equal(out, rearrange_3d_reference(s))
        assert_only_group_data(out, [s])

    def test_3d_transposed_input(self, device):
        s = scale_bytes(3, 9, 140, seed=5, device=device).transpose(1, 2)  # (3, 140, 9), not contiguous
        assert_bytes_equal(rearrange_3d(s), rearrange_3d_reference(s))


class TestArguments:
    def test_bad_scales(self, device):
        offs = torch.tensor([4], dtype=torch.int32, device=device)
        with pytest.raises(ValueError, match="scales"):
            rearrange_m_groups(torch.zeros(4, 4, device=device), offs)
        with pytest.raises(ValueError, match="scales"):
            rearrange_m_groups(scale_bytes(2, 4, 4, device=device), offs)
        with pytest.raises(ValueError, match="scales"):
            rearrange_3d(scale_bytes(4, 4, device=device))

    def test_bad_offs(self, device):
        s = scale_bytes(64, 4, device=device)
        for bad in (torch.tensor([64], dtype=torch.int64), torch.zeros(0, dtype=torch.int32),
                    torch.full((513,), 64, dtype=torch.int32), torch.tensor([[64]], dtype=torch.int32)):  # fmt: skip
            with pytest.raises(ValueError, match="offs"):
                rearrange_m_groups(s, bad.to(device))

    def test_block_cols_and_warps(self, device):
        s = scale_bytes(64, 4, device=device)
        offs = torch.tensor([64], dtype=torch.int32, device=device)
        for bad in (2, 6, 0):
            with pytest.raises(ValueError, match="block_cols"):
                rearrange_m_groups(s, offs, config=RearrangeConfig(bad))
        with pytest.raises(ValueError, match="num_warps"):
            rearrange_3d(scale_bytes(1, 4, 4, device=device), config=RearrangeConfig(4, num_warps=3))

    @pytest.mark.skipif(torch.cuda.is_available(), reason="offs values are read on the host only for CPU tensors")
    def test_host_readable_offs_are_checked(self):
        s = scale_bytes(64, 4)
        with pytest.raises(ValueError, match="offs"):
            rearrange_m_groups(s, torch.tensor([40, 30], dtype=torch.int32))  # decreasing
        with pytest.raises(ValueError, match="offs"):
            rearrange_m_groups(s, torch.tensor([65], dtype=torch.int32))  # past M
        with pytest.raises(ValueError, match="multiple of 32"):
            rearrange_k_groups(s, torch.tensor([32, 80, 128], dtype=torch.int32))  # a group of 48 tokens
        with pytest.raises(ValueError, match="offs"):
            rearrange_k_groups(s, torch.tensor([32 * 5], dtype=torch.int32))  # past the 4 columns' 128 tokens


class TestCosts:
    def test_m_groups(self):
        # DeepSeek-V3 forward A: (131072, 224) scales, G = 8 -> 128 * (1024 + 8) rows x 224
        assert rearrange_m_groups_cost(131072, 224, 8) == scale_layout.Cost(131072 * 224, 132096 * 224)
        # 300 rows -> 3 row blocks + 3 groups = 768 rows, 5 columns -> 8
        assert rearrange_m_groups_cost(300, 5, 3) == scale_layout.Cost(1500, 768 * 8)

    def test_k_groups(self):
        # (7168, 4096) scales of 131072 tokens, G = 8: 7168 x (4096 + 32) written
        assert rearrange_k_groups_cost(7168, 131072, 8) == scale_layout.Cost(7168 * 4096, 7168 * 4128)
        # (200, 3) scales: 256 x (3 + 8) written
        assert rearrange_k_groups_cost(200, 96, 2) == scale_layout.Cost(600, 2816)
        with pytest.raises(ValueError, match="M"):
            rearrange_k_groups_cost(200, 100, 2)

    def test_3d(self):
        assert rearrange_3d_cost(8, 2048, 224) == scale_layout.Cost(8 * 2048 * 224, 8 * 2048 * 224)
        assert rearrange_3d_cost(2, 130, 5) == scale_layout.Cost(1300, 2 * 256 * 8)

    def test_costs_count_the_buffers_the_kernels_return(self):
        s = scale_bytes(300, 5)
        offs = torch.tensor([100, 300], dtype=torch.int32)
        assert rearrange_m_groups_cost(300, 5, 2).bytes_written == rearrange_m_groups_reference(s, offs).numel()
        assert rearrange_k_groups_cost(300, 160, 2).bytes_written == rearrange_k_groups_reference(s, offs).numel()


def test_kernels_build_for_blackwell():
    """The GPU tests build every kernel for SM90; this cross-compiles for SM100, which no test machine has, the
    kernel that uses every shared piece (the group arithmetic and the in-register tile permutation)."""
    args = ["R", "cols", "G", "stride_r", "stride_c", "out_rows"]
    signature = {"s_ptr": "*u8", "offs_ptr": "*i32", "out_ptr": "*u8", **dict.fromkeys(args, "i32")}
    constexprs = {"BLOCK_C": 64, "BLOCK_G": 16}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    ptx = compile_ptx("mxkernels.layouts.scale_layout", "_k_groups_kernel", signature, constexprs, cc=100)
    assert ".entry _k_groups_kernel" in ptx and "st.global" in ptx


# ---- GPU: DeepSeek-V3 sizes and CUDA graphs ---------------------------------------------------------------------

DSV3_CASES = {
    "m_groups_forward_a": (rearrange_m_groups, rearrange_m_groups_reference, (131072, 224), 1),
    "k_groups_a_t": (rearrange_k_groups, rearrange_k_groups_reference, (7168, 4096), 32),
    "k_groups_grad_out_t": (rearrange_k_groups, rearrange_k_groups_reference, (2048, 4096), 32),
}


def dsv3_offs(rows_total, multiple, seed):
    """8 unequal groups (one empty) covering all the tokens."""
    return random_group_ends(random.Random(seed), rows_total, 8, multiple=multiple, empty=(3,)).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("name", DSV3_CASES)
def test_dsv3_groups_match_reference(name):
    kernel, reference, shape, multiple = DSV3_CASES[name]
    s = scale_bytes(*shape, seed=1, device="cuda")
    if multiple == 32:
        s = column_major(s)  # as wgrad's dim1 quantizer produces them
    tokens = shape[0] if multiple == 1 else shape[1] * 32
    offs = dsv3_offs(tokens, multiple, seed=2)
    assert_bytes_equal(kernel(s, offs), reference(s, offs))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 2048, 224), (8, 7168, 64)])
def test_dsv3_3d_matches_reference(shape):
    s = scale_bytes(*shape, seed=1, device="cuda")
    assert_bytes_equal(rearrange_3d(s), rearrange_3d_reference(s))


@pytest.mark.gpu
@pytest.mark.parametrize("name", DSV3_CASES)
def test_groups_replay_in_a_cuda_graph_with_new_offsets(name):
    kernel, reference, shape, multiple = DSV3_CASES[name]
    s = scale_bytes(*shape, seed=1, device="cuda")
    if multiple == 32:
        s = column_major(s)
    tokens = shape[0] if multiple == 1 else shape[1] * 32
    offs = dsv3_offs(tokens, multiple, seed=3)
    out, graph = capture(lambda: kernel(s, offs))
    for seed in (4, 5):
        offs.copy_(dsv3_offs(tokens, multiple, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert_bytes_equal(out, reference(s, offs))


@pytest.mark.gpu
def test_3d_replays_in_a_cuda_graph():
    s = scale_bytes(8, 2048, 224, seed=1, device="cuda")
    out, graph = capture(lambda: rearrange_3d(s))
    s.copy_(scale_bytes(8, 2048, 224, seed=2, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bytes_equal(out, rearrange_3d_reference(s))
