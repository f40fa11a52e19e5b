"""Every figure renders off-screen from a synthetic run; the SVG text shows titles, units and denominators.

The synthetic run (test_report.py) names the "b200" spec: its roofs are that spec's datasheet peaks.
"""

import re
from dataclasses import asdict
from itertools import pairwise
from pathlib import Path

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.legend import Legend
from test_report import synthetic_run

import mxbench
from mxbench import plots
from mxbench.instruments.ceiling_store import Ceilings, measured_peaks
from mxbench.views.panels import Context
from mxbench.workloads.step.figures.step import draw_net_speedup
from mxbench.instruments.hardware import datasheet_peaks, get_spec
from mxbench.storage.results import load_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_width=600):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    height, width, _ = imread(path).shape
    assert width >= min_width and height >= 400


def svg_text(path) -> str:
    """The text of an SVG saved with fonts kept as text (not paths)."""
    return " ".join(re.findall(r">([^<>]+)</text>", path.read_text()))


@pytest.fixture
def svg_text_kept():
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        yield


@pytest.fixture(scope="module")
def run():
    return synthetic_run()


@pytest.fixture(scope="module")
def power_run():
    return synthetic_run(Ms=(65536, 131072), power_limits=(1000.0, 800.0, 600.0))


def test_plot_all_writes_one_png_per_figure(run, tmp_path):
    paths = plots.plot_all(run, tmp_path / "figs")
    assert [p.name for p in paths] == [
        "net_speedup.png", "bandwidth_2d.png", "bandwidth_3d.png", "gemm_speedup.png", "breakdown.png", "roofline.png",
    ]  # fmt: skip
    for p in paths:
        assert_png(p)


def test_plot_all_to_one_file_is_a_sheet_of_every_panel(power_run, tmp_path):
    (path,) = plots.plot_all(power_run, tmp_path / "all.png")
    assert_png(path, min_width=2000)  # three panels a row


def test_power_figures_need_several_limits(run, power_run, tmp_path):
    assert_png(plots.plot_power(power_run, tmp_path / "power.png"), min_width=1500)
    names = [p.name for p in plots.plot_all(power_run, tmp_path / "figs")]
    assert names[-3:] == ["power_time.png", "power_efficiency.png", "power_energy.png"]
    with pytest.raises(ValueError, match="power limits"):
        plots.plot_power(run, tmp_path / "none.png")


@pytest.mark.parametrize(
    "draw",
    [
        lambda run, path: plots.plot_net_speedup(run, path),
        lambda run, path: plots.plot_bandwidth(run, path, dims=2),
        lambda run, path: plots.plot_bandwidth(run, path, dims=3),
        lambda run, path: plots.plot_gemm_speedup(run, path),
        lambda run, path: plots.plot_breakdown(run, path, M=16384),
        lambda run, path: plots.plot_roofline(run, path),
    ],
    ids=["net_speedup", "bandwidth_2d", "bandwidth_3d", "gemm_speedup", "breakdown", "roofline"],
)
def test_each_figure_alone(draw, run, tmp_path):
    assert_png(draw(run, tmp_path / "fig.png"))


def test_labels_name_the_card_units_and_denominators(run, tmp_path, svg_text_kept):
    (path,) = plots.plot_all(run, tmp_path / "all.svg")
    text = svg_text(path)
    assert "NVIDIA B200: N=2048, K=7168, G=8, mxfp8/rceil" in text
    for label in ("M (tokens)", "time per call (us)", "achieved (TFLOP/s)", "FLOP / byte of HBM traffic",
                  "fwd+bwd speedup over bf16 (x)"):  # fmt: skip
        assert label in text
    # the efficiency axes name their denominator; the roofline names each roof and its ridge point
    b200 = get_spec("b200")
    bw = datasheet_peaks(b200)["bandwidth"]
    assert f"bandwidth (% of {bw.label}" in text and bw.label in text
    for tflops in (b200.bf16_tflops, b200.mxfp8_tflops):
        assert f"ridge {tflops / b200.hbm_tbps:.0f} FLOP/B" in text
    assert "bf16 GEMM" in text and f"mxfp8 roofline model ({b200.name}, model, not measured)" in text


def test_measured_ceilings_add_roofs_and_become_the_denominator_when_chosen(tmp_path, svg_text_kept):
    run = synthetic_run()
    ceilings = Ceilings(card="NVIDIA B200", power_limit_w=1000.0, copy_tbps=6.1, read2write1_tbps=6.3,
                        read_tbps=6.9, bandwidth_tbps=6.9, bf16_tflops=1745.0, fp8_tflops=3432.0)  # fmt: skip
    run.meta.update(ceilings=asdict(ceilings), denominator="measured")
    measured = measured_peaks(ceilings)
    text = svg_text(plots.plot_all(run, tmp_path / "all.svg")[0])
    assert f"bandwidth (% of {measured['bandwidth'].label})" in text
    assert measured["bf16"].label in text and datasheet_peaks(get_spec("b200"))["bandwidth"].label in text


def test_a_model_run_is_labelled_as_such(tmp_path, svg_text_kept):
    path = plots.plot_net_speedup(synthetic_run(model=True), tmp_path / "net.svg")
    text = svg_text(path)
    assert "b200 (model, not measured)" in text and "mxfp8 measured" not in text


def test_a_run_without_a_spec_skips_the_panels_that_need_peaks(tmp_path):
    run = synthetic_run()
    del run.meta["hardware"]
    names = [p.name for p in plots.plot_all(run, tmp_path / "figs")]
    assert names == ["net_speedup.png", "gemm_speedup.png", "breakdown.png"]


def test_bad_dims_are_rejected(run, tmp_path):
    with pytest.raises(ValueError, match="dims"):
        plots.plot_bandwidth(run, tmp_path / "x.png", dims=4)


def test_no_display_is_needed(run, tmp_path, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    backend = matplotlib.get_backend()
    plots.plot_breakdown(run, tmp_path / "b.png")
    assert matplotlib.get_backend() == backend  # figures never go through pyplot's global backend


# ------------------------------------------------------------------------------ frames, peers, what people read

RESULTS = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200"


def drawn(fig: Figure):
    """Lay out and draw ``fig`` as a PNG would be (constrained layout applied); the renderer that drew it."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _inside(inner, outer) -> bool:
    return (
        inner.x0 >= outer.x0 - 0.5
        and inner.y0 >= outer.y0 - 0.5
        and inner.x1 <= outer.x1 + 0.5
        and (inner.y1 <= outer.y1 + 0.5)
    )


def test_figures_take_a_frame_of_one_run_and_return_figures():
    df = mxbench.load(RESULTS)
    one = df[df["file"] == str(RESULTS / "roofline-deepseek-v3.json")]
    for make in (plots.net_speedup_figure, plots.gemm_speedup_figure, plots.breakdown_figure, plots.roofline_figure):
        assert isinstance(make(one), Figure)
    with pytest.raises(ValueError, match=r"a figure draws one run; this frame holds \d+ files"):
        plots.breakdown_figure(df)


def test_the_roofline_legends_and_tick_labels_stay_inside_the_canvas_apart():
    fig = plots.roofline_figure(load_run(RESULTS / "roofline-deepseek-v3.json"))
    renderer = drawn(fig)
    (ax,) = fig.axes
    legends = [a for a in ax.get_children() if isinstance(a, Legend)]
    assert len(legends) == 2  # the points' and the roofs'
    for legend in legends:
        assert _inside(legend.get_window_extent(renderer), fig.bbox)
    labels = [t for t in ax.get_xticklabels() if t.get_text() and _inside(t.get_window_extent(renderer), fig.bbox)]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    assert len(boxes) >= 3 and all(a.x1 < b.x0 for a, b in pairwise(boxes))


def test_the_breakdown_legend_leaves_the_bar_totals_readable():
    fig = plots.breakdown_figure(load_run(RESULTS / "roofline-deepseek-v3.json"))
    renderer = drawn(fig)
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    totals = [t.get_window_extent(renderer) for t in ax.texts]
    assert [t.get_text() for t in ax.texts] == ["7308", "6618", "6994"]
    assert not any(legend.overlaps(t) for t in totals) and _inside(legend, fig.bbox)


def test_a_peers_run_draws_the_peers_figure(tmp_path, svg_text_kept):
    paths = plots.plot_all(load_run(RESULTS / "peers-deepseek-v3.json"), tmp_path / "figs")
    assert [p.name for p in paths] == ["peers.png"]
    assert_png(paths[0], min_width=1200)
    (path,) = plots.plot_all(load_run(RESULTS / "peers-deepseek-v3.json"), tmp_path / "peers.svg")
    text = svg_text(path)
    for words in ("mxkernels", "torchao", "torch.compile", "HBM roof: H200 SXM datasheet 4.8 TB/s", "fwd quantize_a",
                  "bandwidth (GB/s: declared bytes / median time)", "error"):  # fmt: skip
        assert words in text


def test_titles_name_the_group_split_and_the_scale_mode_only_for_mxfp8(tmp_path, svg_text_kept):
    fp8 = svg_text(plots.plot_all(load_run(RESULTS / "roofline-deepseek-v3-fp8_rowwise.json"), tmp_path / "a.svg")[0])
    assert "N=2048, K=7168, G=8, fp8_rowwise, balanced groups" in fp8 and "fp8_rowwise/rceil" not in fp8
    skewed = svg_text(plots.plot_all(load_run(RESULTS / "roofline-deepseek-v3-skewed.json"), tmp_path / "b.svg")[0])
    assert "N=2048, K=7168, G=8, mxfp8/rceil, skewed groups" in skewed


def test_no_mxfp8_model_line_at_the_fp8_roof_of_a_card_without_mx_tensor_cores(tmp_path, svg_text_kept):
    hopper = synthetic_run(card="NVIDIA H100 80GB HBM3", hardware="h100-sxm")
    text = svg_text(plots.plot_net_speedup(hopper, tmp_path / "net.svg"))
    assert "mxfp8 measured" in text and "mxfp8 roofline model (" not in text
    assert "no mxfp8 roofline model: H100 SXM has no MX tensor cores" in text
    paths = plots.plot_all(hopper, tmp_path / "figs", project="b200")
    assert paths[-1].name == "projection_b200.png"
    assert_png(paths[-1], min_width=1200)
    projected = svg_text(plots.save(plots.projection_figure(hopper, "b200"), tmp_path / "p.svg"))
    projection = "mxfp8 on B200, projection from NVIDIA H100 80GB HBM3 efficiencies"
    for words in ("mxfp8 measured on NVIDIA H100 80GB HBM3", projection, "mxfp8 B200 peak model",
                  "Time per pass at M=131072: projection from"):  # fmt: skip
        assert words in projected


def test_net_speedup_draws_fused_scales_twins_as_curves_of_their_own():
    path = Path(__file__).resolve().parent.parent / "results/nvidia-h100-80gb-hbm3/roofline-deepseek-v3.json"
    run = load_run(path)
    fig = Figure()
    ax = fig.add_subplot()
    assert draw_net_speedup(ax, Context.of(run))
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert {"fp8_rowwise measured", "fp8_rowwise, fused scales measured", "mxfp8, fused scales measured"} <= set(lines)
    # The fused curve's points, from the records by hand: the bf16 step's end-to-end median over the fused step's.
    df = mxbench.load(path)
    e2e = df[df["pass_name"] == "end_to_end"]
    for M, y in zip(*lines["fp8_rowwise, fused scales measured"].get_data(), strict=True):
        at = e2e[e2e["M"] == M]
        bf16 = at[at["recipe"] == "bf16"]["median_us"].iloc[-1]
        fused = at[(at["recipe"] == "fp8_rowwise") & at["fuse_scales"]]["median_us"].iloc[-1]
        assert y == pytest.approx(bf16 / fused)
    assert len(lines["fp8_rowwise, fused scales measured"].get_xdata()) == 4
