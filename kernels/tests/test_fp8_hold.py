"""The holding kernel's launch options (kernels/mxkernels/quant/fp8_hold.py): packed bf16 pairs, the prefetched next
strip and the register cap change speed only, so every launch must give the plain-torch oracle's bits
(``fp8_rowwise``'s references) on the shapes that take each of its paths: strips held whole, strips too long or off
16-row boundaries (walked), empty groups (first, inside, last), rows past ``offs[-1]``, a last strip that is partial
(columns not a multiple of the strip), and inputs the packed path cannot take (fp32, an odd column count, columns
not unit-stride), which run the plain path. Also: the defaults table picks as documented, and the packed kernel
compiles for sm_90 to 16-byte loads and stores."""

import pytest
import torch
from crosscompile import compile_ptx
from kernel_helpers import offsets
from mxkernels.core.runtime import InputError
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H
from mxkernels.quant import fp8_rowwise as F

# Tiny launches covering each new path: held strips of up to 64 rows (longer or unaligned ones walk in 16-row
# steps), the plain, packed and prefetched ways, 2 or 1 programs an "SM" (4 SMs on CPU: each program walks several
# items, so the prefetch crosses items and groups), a strip wider than some inputs' columns (partial strips).
LAUNCHES = {
    "plain": H.HoldConfig(strip_cols=16, hold_rows=64, step_rows=16, num_warps=2),
    "packed": H.HoldConfig(strip_cols=16, hold_rows=64, step_rows=16, num_warps=2, packed=True),
    "prefetch": H.HoldConfig(strip_cols=8, hold_rows=64, step_rows=16, num_warps=2, prefetch=True),
    "packed + prefetch": H.HoldConfig(
        strip_cols=16, hold_rows=64, step_rows=16, num_warps=2, programs_per_sm=1, packed=True, prefetch=True
    ),
    "packed, 2-column strips, capped": H.HoldConfig(
        strip_cols=2, hold_rows=32, step_rows=16, num_warps=1, packed=True, max_registers=128
    ),
    "grid": H.HoldConfig(strip_cols=16, hold_rows=64, step_rows=16, num_warps=2, persistent=False),
    "grid, packed": H.HoldConfig(strip_cols=8, hold_rows=64, step_rows=16, num_warps=2, persistent=False, packed=True),
}
# Empty groups first, inside and last; groups held (16, 32, 48, 64 rows), one too long to hold (80: walks), one off
# the 16-row boundaries (5, and every group after it: walks); rows past offs[-1] (the input has 260).
GROUP_SIZES = [[0, 16, 0, 32, 80, 48, 0], [64, 5, 16, 0, 32], [0, 0, 0]]


def _values(shape, gen) -> torch.Tensor:
    """Normal values spread over 2**-10 .. 2**10 by column, a zero column and a column holding one huge value."""
    x = torch.randn(shape, generator=gen) * torch.logspace(-10, 10, shape[-1], base=2.0)
    x[..., 1] = 0
    x[..., -1] *= 1e-3
    x.view(-1, shape[-1])[3, -1] = 3e38
    return x


def _assert_k_groups(x, sizes, config):
    offs = offsets(sizes, x.device)
    q, scale = F.quantize_fp8_rowwise_k_groups(x, offs, config=config)
    q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    end = sum(sizes)
    mismatch = (q[:, :end].view(torch.uint8) != q_ref[:, :end].view(torch.uint8)).sum().item()
    assert mismatch == 0, f"{mismatch} bytes differ, groups {sizes}"
    assert torch.equal(scale, scale_ref), f"scales differ, groups {sizes}"


# Every launch at 40 columns (a partial last strip) and 48; the 2-column strips (the interpreter's slowest launch:
# a program per column pair) at 40 only, where its partial-strip path is.
K_GROUPS_RUNS = [(name, R) for R in (40, 48) for name in LAUNCHES if not (R == 48 and name.startswith("packed, 2"))]


@pytest.mark.parametrize("name, R", K_GROUPS_RUNS, ids=[f"{R}-{name}" for name, R in K_GROUPS_RUNS])
def test_k_groups_launches_give_the_oracles_bits(device, name, R, poisoned_empty):
    gen = torch.Generator().manual_seed(11)
    for sizes in GROUP_SIZES:
        x = _values((260, R), gen).to(device).bfloat16()
        _assert_k_groups(x, sizes, LAUNCHES[name])


@pytest.mark.parametrize("name", list(LAUNCHES))
@pytest.mark.parametrize("N", [48, 40, 96])
def test_3d_along_n_launches_give_the_oracles_bits(device, name, N, poisoned_empty):
    """N = 48 held, 40 off the 16-row boundaries (walks), 96 longer than 64 rows (walks); K = 40: a partial strip.
    The 2-column strips have no partial strip at any even K, and walk every N here (they hold 32 rows): K = 8 (4
    strips an expert, the zero and the huge column among them) keeps their paths at a fifth of the items."""
    K = 8 if name.startswith("packed, 2") else 40
    w = _values((3, N, K), torch.Generator().manual_seed(N)).to(device).bfloat16()
    q, scale = F.quantize_fp8_rowwise_3d(w, along="N", config=LAUNCHES[name])
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
    assert (q.view(torch.uint8) != q_ref.view(torch.uint8)).sum().item() == 0
    assert torch.equal(scale, scale_ref)


@pytest.mark.parametrize("case", ["fp32", "odd columns", "columns strided", "offset by one element"])
def test_inputs_the_packed_path_cannot_take_run_the_plain_one(device, case, poisoned_empty):
    """The packed launch on inputs it cannot view as bf16 pairs: still the oracle's bits (the plain path runs)."""
    gen = torch.Generator().manual_seed(5)
    config = LAUNCHES["packed + prefetch"]
    if case == "fp32":
        x = _values((100, 40), gen).to(device)
    elif case == "odd columns":  # rows 40 apart: only the column count rules the words view out
        x = _values((100, 40), gen).to(device).bfloat16()[:, :39]
    elif case == "columns strided":  # every other column: rows 80 apart, columns 2
        x = _values((100, 80), gen).to(device).bfloat16()[:, ::2]
    else:
        x = torch.cat([torch.ones(1), _values((100, 40), gen).flatten()]).to(device).bfloat16()[1:].view(100, 40)
    _assert_k_groups(x, [16, 0, 48, 32], config)
    assert H._words(x, x.shape[1], (0, *x.stride())) is None


def test_packed_words_view_is_the_inputs_pairs():
    """Where x can be viewed as pairs: the words view starts at x's first element and its strides are in words."""
    x = torch.arange(2 * 6 * 8, dtype=torch.int16).view(torch.bfloat16).view(2, 6, 8)
    words, strides = H._words(x, 8, x.stride())
    assert strides == (24, 4)
    assert words.dtype == torch.int32 and words.data_ptr() == x.data_ptr()
    pair = words[1 * 24 + 2 * 4 + 3].item()  # expert 1, row 2, columns 6 and 7
    assert pair & 0xFFFF == x[1, 2, 6].view(torch.int16).item() and pair >> 16 == x[1, 2, 7].view(torch.int16).item()


def test_hold_config_checks_its_fields():
    with pytest.raises(InputError, match="packed"):
        H.HoldConfig(16, 64, packed=1)
    with pytest.raises(InputError, match="prefetch"):
        H.HoldConfig(16, 64, prefetch="yes")
    with pytest.raises(InputError, match="max_registers"):
        H.HoldConfig(16, 64, max_registers=300)
    with pytest.raises(InputError, match="WalkConfig.max_registers"):
        C.WalkConfig(16, 64, max_registers=-1)
    with pytest.raises(InputError, match="strip_cols"):
        H.HoldConfig(1, 64, packed=True)
    with pytest.raises(InputError, match="persistent"):
        H.HoldConfig(16, 64, persistent=0)
    with pytest.raises(InputError, match="prefetch needs persistent"):
        H.HoldConfig(16, 64, prefetch=True, persistent=False)
    assert H.HoldConfig(16, 64, num_warps=4, persistent=False).label() == "hold 16x64 w4 grid"
    assert (
        H.HoldConfig(32, 1024, num_warps=16, programs_per_sm=1, packed=True).label() == "hold 32x1024 w16 1/SM packed"
    )


def test_defaults_table_picks_by_shape_class(monkeypatch):
    """The first row whose bound the rows do not exceed; RULE is ``hold_config``; a row's launch is returned as is."""
    assert H.along_n_config(1024) == H.hold_config(1024) and H.along_n_config(1025) is C.ALONG_N_CONFIG
    assert H.along_n_config(2880) is H.ALONG_N_DEFAULTS[2][1] and H.along_n_config(4097) is H.ALONG_N_DEFAULTS[3][1]
    assert H.k_groups_config(65536, 128) is H.K_GROUPS_DEFAULTS[0][1]  # average group 512
    assert H.k_groups_config(131072, 128) is H.K_GROUPS_DEFAULTS[1][1]  # average group 1024
    assert H.k_groups_config(131072, 8) is C.K_GROUPS_CONFIG
    mine = H.HoldConfig(64, 2048, num_warps=16, programs_per_sm=1, packed=True)
    monkeypatch.setattr(H, "ALONG_N_DEFAULTS", ((1024, H.RULE), (2048, mine), (1 << 31, C.ALONG_N_CONFIG)))
    assert (
        H.along_n_config(1536) is mine and H.along_n_config(2048) is mine and H.along_n_config(2049) is C.ALONG_N_CONFIG
    )
    monkeypatch.setattr(H, "K_GROUPS_DEFAULTS", ((512, mine),))
    assert H.k_groups_config(65536, 128) is mine and H.k_groups_config(131072, 128) is C.K_GROUPS_CONFIG


_SIG = {"x_ptr": "*bf16", "xw_ptr": "*i32", "offs_ptr": "*i32", "q_ptr": "*u8", "scale_ptr": "*fp32",
        **{a: "i32" for a in ("rows", "cols", "G", "PROGRAMS", "stride_xg", "stride_xm")}, "stride_xc": "constexpr",
        **{a: "i32" for a in ("stride_wg", "stride_wm", "stride_qg", "stride_qc")},
        **{c: "constexpr" for c in ("HAS_OFFS", "STRIP", "HOLD", "STEP", "PACKED", "PREFETCH", "PERSISTENT", "EXACT")}}  # fmt: skip


@pytest.mark.parametrize("prefetch, persistent", [(False, True), (True, True), (False, False)],
                         ids=["", "prefetch", "grid"])  # fmt: skip
def test_packed_kernel_compiles_to_16_byte_loads_and_stores(prefetch, persistent):
    """Packed 64 x 512 at 8 warps for sm_90: the words are loaded 16 bytes at a time (no narrower global loads of
    x) and both columns of each pair stored transposed in 16-byte vectors, with the e4m3 hardware cast."""
    constexprs = {"HAS_OFFS": True, "STRIP": 64, "HOLD": 512, "STEP": 256, "EXACT": False, "stride_xc": 1,
                  "PACKED": True, "PREFETCH": prefetch, "PERSISTENT": persistent}  # fmt: skip
    aligned = ("x_ptr", "xw_ptr", "q_ptr", "scale_ptr", "rows", "cols", "stride_xg", "stride_xm", "stride_wg",
               "stride_wm", "stride_qg", "stride_qc")  # fmt: skip
    ptx = compile_ptx("mxkernels.quant.fp8_hold", "_hold_kernel", _SIG, constexprs, 90, aligned, {"num_warps": 8})
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx


@pytest.mark.gpu
def test_gpu_packed_and_prefetched_holds_bit_exact_at_fine_grained_shapes(poisoned_empty):
    """The sweep's new launches at Qwen3-30B-A3B's shapes on a GPU: 128 groups of 512 with ragged ones among them
    (empty, 1 row, unaligned, longer than the hold: walked) and rows past offs[-1]; weights along N (2048 rows)."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    ragged = [512] * 120 + [0, 1, 16, 37, 1000, 2048, 0, 512]
    x = torch.randn(65536 + 4096, 768, device="cuda", generator=gen).bfloat16()
    for config in (H.HoldConfig(32, 512, num_warps=8, persistent=False),
                   H.HoldConfig(64, 512, num_warps=16, persistent=False, max_registers=64),
                   H.HoldConfig(64, 512, num_warps=8, persistent=False, packed=True, max_registers=128),
                   H.HoldConfig(64, 512, num_warps=16, programs_per_sm=1, packed=True, prefetch=True),
                   H.HoldConfig(32, 512, num_warps=8, programs_per_sm=2, max_registers=128)):  # fmt: skip
        _assert_k_groups(x, ragged, config)
    w = (torch.randn(128, 2048, 768, device="cuda", generator=gen) * 0.03).bfloat16()
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
    capped_walk = C.WalkConfig(64, 128, num_warps=4, programs_per_sm=4, prefetch=False, num_stages=3, max_registers=128)
    for config in (H.HoldConfig(32, 2048, num_warps=16, programs_per_sm=1, packed=True),
                   H.HoldConfig(16, 2048, num_warps=16, programs_per_sm=1, packed=True, prefetch=True),
                   H.HoldConfig(16, 2048, num_warps=8, persistent=False, packed=True, max_registers=128),
                   capped_walk):  # fmt: skip
        q, scale = F.quantize_fp8_rowwise_3d(w, along="N", config=config)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)
