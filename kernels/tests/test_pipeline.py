"""The pipeline: what each pass runs, what each stage costs, and the autograd function built from the same stages."""

import pytest
import torch
from mxkernels.autograd import projection
from mxkernels.core.runtime import InputError
from mxkernels.stages import ep_stages, layer, pipeline
from mxkernels.core.format import dequantize_reference, quantize_reference

DSV3 = dict(M=131072, N=2048, K=7168, G=8)


def names(stages, pass_name):
    return [s.name for s in stages if s.pass_name == pass_name]


def by_name(stages, pass_name, name):
    (stage,) = [s for s in stages if s.pass_name == pass_name and s.name == name]
    return stage


class TestPlan:
    def test_mxfp8_passes_run_the_seed_table_kernels_in_order(self):
        sizes = [DSV3["M"] // 8] * 8
        stages = pipeline.plan_step("mxfp8", **DSV3, group_sizes=sizes, backend="emulated")
        assert names(stages, "forward") == ["quantize_a", "quantize_w", "rearrange_a", "rearrange_w", "gemm_fwd"]
        assert names(stages, "backward_input") == [
            "quantize_grad_out", "quantize_w_t", "rearrange_grad_out", "rearrange_w_t", "gemm_dgrad",
        ]  # fmt: skip
        assert names(stages, "backward_weight") == [
            "quantize_grad_out_t", "quantize_a_t", "rearrange_grad_out_t", "rearrange_a_t", "gemm_wgrad",
        ]  # fmt: skip
        assert all(s.run is None and s.fn is not None for s in stages)

    def test_dsv3_costs_match_hand_counts(self):
        M, N, K, G = DSV3["M"], DSV3["N"], DSV3["K"], DSV3["G"]
        stages = pipeline.plan_step("mxfp8", M, N, K, G, [M // G] * G, backend="emulated")
        qa = by_name(stages, "forward", "quantize_a").cost
        # bf16 in (2 B), e4m3 out (1 B) plus one e8m0 byte per 32 elements
        assert (qa.bytes_read, qa.bytes_written) == (2 * M * K, M * K + M * K // 32)
        assert round(qa.bytes / 1e9, 3) == 2.848  # the seed's figure for this kernel
        ra = by_name(stages, "forward", "rearrange_a").cost
        # scales (M, K/32) = (131072, 224) read; the whole (128 * (M/128 + G), 224) buffer written
        assert (ra.bytes_read, ra.bytes_written) == (M * 224, (M + 128 * G) * 224)
        gemm = by_name(stages, "backward_weight", "gemm_wgrad").cost
        assert gemm.flops == 2 * M * N * K and gemm.precision == "mxfp8"
        rk = by_name(stages, "backward_weight", "rearrange_a_t").cost
        assert (rk.bytes_read, rk.bytes_written) == (K * M // 32, K * (M // 32 + 4 * G))

    def test_unaligned_groups_add_pad_and_unpad_stages(self):
        stages = pipeline.plan_step("mxfp8", 100, 64, 64, 3, [50, 0, 50], backend="emulated")
        assert names(stages, "forward")[0] == "pad_a"
        assert names(stages, "forward")[-1] == "unpad_out"
        assert names(stages, "backward_input")[0] == "pad_grad_out"
        quantize_a = by_name(stages, "forward", "quantize_a")
        padded_rows = 32 * -(-(100 + 32 * 3) // 32)  # ceil_32(M + 32 G) = 224
        assert quantize_a.shapes == ((padded_rows, 64),)

    def test_fused_scales_replace_each_quantize_and_rearrange_pair(self):
        M, N, K, G = DSV3["M"], DSV3["N"], DSV3["K"], DSV3["G"]
        sizes = [M // G] * G
        unfused = pipeline.plan_step("mxfp8", M, N, K, G, sizes, backend="emulated")
        fused = pipeline.plan_step("mxfp8", M, N, K, G, sizes, backend="emulated", fuse_scales=True)
        assert names(fused, "forward") == ["quantize_a_blocked", "quantize_w_blocked", "gemm_fwd"]
        assert names(fused, "backward_input") == ["quantize_grad_out_blocked", "quantize_w_t_blocked", "gemm_dgrad"]
        assert names(fused, "backward_weight") == [
            "quantize_grad_out_t_blocked", "quantize_a_t_blocked", "gemm_wgrad",
        ]  # fmt: skip
        # Every GEMM reads the same tensor names; each fused stage writes what its pair wrote, less the scales
        # between them, and moves the quantizer's data plus the whole blocked buffer.
        gemms = [s for s in unfused if s.category == "gemm"]
        assert [s.inputs for s in gemms] == [s.inputs for s in fused if s.category == "gemm"]
        for p in pipeline.PASSES:
            for f in (s for s in fused if s.pass_name == p and s.category == "quantize"):
                q = by_name(unfused, p, f.name.removesuffix("_blocked"))
                r = by_name(unfused, p, f.name.replace("quantize", "rearrange").removesuffix("_blocked"))
                assert f.outputs == (q.outputs[0], r.outputs[0]) and f.spec.params == ("mode",)
                assert f.cost.bytes_read == q.cost.bytes_read
                assert f.cost.bytes_written == q.cost.bytes_written - r.cost.bytes_read + r.cost.bytes_written
        assert pipeline.plan_step("bf16", 256, 64, 64, 2, [128, 128], fuse_scales=True) == pipeline.plan_step(
            "bf16", 256, 64, 64, 2, [128, 128]
        )
        with pytest.raises(ValueError, match="fuse_scales"):
            pipeline.plan_step("mxfp8", 256, 64, 64, 2, [128, 128], fuse_scales="yes")

    def test_bf16_is_three_gemms(self):
        stages = pipeline.plan_step("bf16", 256, 64, 64, 2, [128, 128])
        assert [(s.pass_name, s.category) for s in stages] == [(p, "gemm") for p in pipeline.PASSES]

    @pytest.mark.parametrize(
        "kwargs, message",
        [
            (dict(recipe="int4"), "recipe"),
            (dict(N=48), "N must be a multiple of 32"),
            (dict(G=0, group_sizes=[]), "G must be between 1 and 512"),
            (dict(group_sizes=[100, 100]), "group_sizes"),
        ],
    )
    def test_bad_input_is_named(self, kwargs, message):
        args = dict(recipe="mxfp8", M=256, N=64, K=64, G=2, group_sizes=[128, 128], backend="emulated")
        args.update(kwargs)
        with pytest.raises(ValueError, match=message):
            pipeline.plan_step(**args)

    # The workloads check their problem's sizes alike (``pipeline.check_sizes``), each naming them as its user does.
    WORKLOADS = {
        "step": lambda T, K, N, E: pipeline.plan_step("mxfp8", T, N, K, E, [T] + [0] * (E - 1)),
        "layer": lambda T, K, N, E: layer.LayerShape(T, K, N, E, top_k=1),
        "ep": lambda T, K, N, E: ep_stages.check_layer(T, K, N, E, top_k=1, world=2),
    }

    @pytest.mark.parametrize("workload", WORKLOADS)
    @pytest.mark.parametrize(
        "change, message",
        [
            ({"K": 0}, "K must be a positive integer, got 0"),
            ({"T": 64.0}, "must be a positive integer, got 64.0"),
            ({"N": True}, "N must be a positive integer, got True"),
            ({"N": 48}, "N must be a multiple of 32, got 48"),
            ({"K": 80}, "K must be a multiple of 32, got 80"),
            ({"E": 0}, "must be between 1 and 512, got 0"),
            ({"E": 513}, "must be between 1 and 512, got 513"),
        ],
    )
    def test_every_workload_checks_its_sizes(self, workload, change, message):
        sizes = {"T": 64, "K": 64, "N": 64, "E": 2, **change}
        with pytest.raises(InputError, match=message):
            self.WORKLOADS[workload](**sizes)
        self.WORKLOADS[workload](T=64, K=64, N=64, E=2)  # the same call with good sizes passes


def mx_round_trip(x):
    """What MXFP8 quantization keeps of x (blocks along the last dim), in fp32."""
    return dequantize_reference(*quantize_reference(x))


def zero_pad_cols(x, multiple):
    cols = -(-x.shape[1] // multiple) * multiple
    return torch.nn.functional.pad(x, (0, cols - x.shape[1])).contiguous()


def reference_step(a, w, grad_out, sizes):
    """fp32 forward and both gradients of the grouped GEMM with every operand MX-rounded along its contraction dim."""
    out, grad_a, grad_w, start = [], [], [], 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        start += size
        out.append(mx_round_trip(a[rows]) @ mx_round_trip(w[g]).t())
        grad_a.append(mx_round_trip(grad_out[rows]) @ mx_round_trip(w[g].t().contiguous()).t())
        # Along M, each group is padded with zero rows to a multiple of 32 so no block straddles two experts.
        dy_t = mx_round_trip(zero_pad_cols(grad_out[rows].t(), 32))
        a_t = mx_round_trip(zero_pad_cols(a[rows].t(), 32))
        grad_w.append(dy_t @ a_t.t())
    return torch.cat(out), torch.cat(grad_a), torch.stack(grad_w)


@pytest.mark.parametrize("sizes", [[64, 0, 96], [40, 7, 81]], ids=["aligned", "unaligned"])
def test_autograd_matches_the_mx_rounded_reference(device, sizes):
    M, N, K, G = sum(sizes), 64, 96, len(sizes)
    t = pipeline.make_inputs(M, N, K, G, sizes, device=device, seed=1)
    a = t["a"].clone().requires_grad_()
    b_t = t["w"].transpose(-2, -1).clone().requires_grad_()
    out = projection.mxfp8_grouped_mm(a, b_t, t["offs"], backend="emulated")
    grad_a, grad_b_t = torch.autograd.grad(out, (a, b_t), t["grad_out"])

    ref_out, ref_grad_a, ref_grad_w = reference_step(t["a"].cpu(), t["w"].cpu(), t["grad_out"].cpu(), sizes)
    assert out.shape == (M, N) and grad_a.shape == (M, K) and grad_b_t.shape == (G, K, N)
    torch.testing.assert_close(out.float().cpu(), ref_out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grad_a.float().cpu(), ref_grad_a, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(grad_b_t.float().cpu(), ref_grad_w.transpose(-2, -1), rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("sizes", [[64, 0, 96], [40, 7, 81]], ids=["aligned", "unaligned"])
def test_fused_scales_step_computes_the_same_bits(device, sizes):
    """The fused-scale quantizers hand the GEMMs the very bytes quantize + rearrange did: the same outputs and
    gradients, bit for bit."""
    M, N, K, G = sum(sizes), 64, 96, len(sizes)
    t = pipeline.make_inputs(M, N, K, G, sizes, device=device, seed=2)
    results = []
    for fuse in (False, True):
        a = t["a"].clone().requires_grad_()
        b_t = t["w"].transpose(-2, -1).clone().requires_grad_()
        out = projection.mxfp8_grouped_mm(a, b_t, t["offs"], backend="emulated", fuse_scales=fuse)
        results.append((out, *torch.autograd.grad(out, (a, b_t), t["grad_out"])))
    for unfused, fused in zip(*results, strict=True):
        assert torch.equal(unfused.view(torch.int16), fused.view(torch.int16))
    step = projection.end_to_end("mxfp8", M, N, K, G, sizes, backend="emulated", device=device, seed=2, fuse_scales=True)
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(step(), results[1][1:]))


# ---------------------------------------------------------------------------------------------------------------------
# On a GPU: the autograd drop-in against fp32 autograd, and the whole step in one CUDA graph
# ---------------------------------------------------------------------------------------------------------------------

GPU_SIZES = [1000, 0, 777, 2319]  # unaligned and an empty group: the step pads, quantizes, rearranges, unpads


def signal_to_noise_db(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.square().sum() / (x - ref).square().sum())).item()


def fp32_step(t, sizes):
    """Forward and both gradients of the grouped GEMM in fp32 autograd, one matmul per group."""
    a = t["a"].float().requires_grad_()
    w = t["w"].float().requires_grad_()
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    out = torch.cat([a[lo:hi] @ w[g].t() for g, (lo, hi) in enumerate(zip(bounds, bounds[1:]))])
    grad_a, grad_w = torch.autograd.grad(out, (a, w), t["grad_out"].float())
    return out, grad_a, grad_w.transpose(-2, -1)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, floor_db", [("bf16", 40), ("mxfp8", 25), ("fp8_rowwise", 25)])
def test_gpu_autograd_drop_in_matches_fp32(recipe, floor_db):
    sizes = GPU_SIZES
    M, N, K, G = sum(sizes), 1024, 2048, len(sizes)
    t = pipeline.make_inputs(M, N, K, G, sizes, device="cuda", seed=3)
    refs = fp32_step(t, sizes)
    a = t["a"].clone().requires_grad_()
    b_t = t["w"].transpose(-2, -1).clone().requires_grad_()
    op = {"bf16": projection.bf16_grouped_mm, "mxfp8": projection.mxfp8_grouped_mm,
          "fp8_rowwise": projection.fp8_rowwise_grouped_mm}[recipe]  # fmt: skip
    out = op(a, b_t, t["offs"])
    got = (out, *torch.autograd.grad(out, (a, b_t), t["grad_out"]))
    for name, x, ref in zip(("out", "grad_a", "grad_b_t"), got, refs, strict=True):
        assert x.shape == ref.shape, name
        db = signal_to_noise_db(x, ref)
        print(f"{recipe} {name}: {db:.1f} dB vs fp32 autograd")
        assert db >= floor_db, (recipe, name, db)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, fuse", [(r, False) for r in pipeline.RECIPES] + [("mxfp8", True)])
def test_gpu_whole_step_replays_from_one_cuda_graph(recipe, fuse):
    """Forward + backward of the autograd function, every stage of every pass, captured once and replayed: no host
    sync anywhere, and the replay computes what the eager step computes."""
    sizes = GPU_SIZES
    step = projection.end_to_end(recipe, sum(sizes), 512, 1024, len(sizes), sizes, device="cuda", seed=4,
                               fuse_scales=fuse)  # fmt: skip
    eager = [g.clone() for g in step()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for g_eager, g_graph in zip(eager, captured, strict=True):
        torch.testing.assert_close(g_graph, g_eager, rtol=0, atol=0)
