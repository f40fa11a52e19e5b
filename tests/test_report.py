"""Tables from a synthetic stored run whose times are chosen by hand, so every printed number is known in advance.

``synthetic_run`` is also the input of the figure tests (test_plots.py imports it).
"""

import csv
import io
import re

import pytest
from mxkernels.core.errors import InputError

from mxbench.views import render
from mxbench.reporting import tables as front_door
from mxbench.workloads.step import tables
from mxbench.instruments.hardware import Peak
from mxbench.storage.results import Point, Record, Run

N, K, G = 2048, 7168, 8
MS = (16384, 32768, 65536, 131072)
PEAKS = {
    "bandwidth": Peak(8.0, "TB/s", "B200 datasheet BW"),
    "bf16": Peak(2250.0, "TFLOP/s", "B200 datasheet bf16"),
    "fp8": Peak(4500.0, "TFLOP/s", "B200 datasheet fp8"),
    "mxfp8": Peak(4500.0, "TFLOP/s", "B200 datasheet mxfp8"),
}
# Hand-chosen times (us) at M = 131072; stages on activations scale with M, stages on weights (3D) do not.
# Per-GEMM speedups over bf16: forward 2000/1000, dA 2000/1000, dB 2100/1400; net 6100/4000.
MX_GEMM_US = {"forward": 1000.0, "backward_input": 1000.0, "backward_weight": 1400.0}
BF16_GEMM_US = {"forward": 2000.0, "backward_input": 2000.0, "backward_weight": 2100.0}
MX_E2E_US, BF16_E2E_US = 4000.0, 6100.0


def _quant(rows: int, cols: int) -> tuple[int, int]:
    return 2 * rows * cols, rows * cols + rows * cols // 32


def mxfp8_stages(M: int) -> list[tuple]:
    """(pass, stage, kernel, category, purpose, shape, bytes read, bytes written, flops, precision, us at M=131072,
    scales with M)."""
    Kb, Nb, Mb = K // 32, N // 32, M // 32
    fwd, dA, dB = "forward", "backward_input", "backward_weight"
    gemm = lambda m, n, k: (m * k + G * n * k, 2 * m * n, 2 * m * n * k, "mxfp8")
    return [
        (fwd, "quantize_a", "quantize_dim0", "quantize", "Quantize A along K", f"({M}, {K})", *_quant(M, K), 0, None, 500.0, True),
        (fwd, "quantize_w", "quantize_3d(along=K)", "quantize", "Quantize B along K", f"({G}, {N}, {K})", *_quant(G * N, K), 0, None, 65.0, False),
        (fwd, "rearrange_a", "rearrange_m_groups", "rearrange", "A scales to blocked", f"({M}, {Kb})", M * Kb, (M + 128 * G) * Kb, 0, None, 30.0, True),
        (fwd, "rearrange_w", "rearrange_3d", "rearrange", "B scales to blocked", f"({G}, {N}, {Kb})", G * N * Kb, G * N * Kb, 0, None, 13.0, False),
        (fwd, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 3D scaled grouped GEMM", f"({M}, {K}) @ ({G}, {K}, {N})", *gemm(M, N, K), MX_GEMM_US[fwd], True),
        (dA, "quantize_grad_out", "quantize_dim0", "quantize", "Quantize grad_out along N", f"({M}, {N})", *_quant(M, N), 0, None, 144.0, True),
        (dA, "quantize_w_t", "quantize_3d(along=N)", "quantize", "Quantize B along N", f"({G}, {N}, {K})", *_quant(G * N, K), 0, None, 70.0, False),
        (dA, "rearrange_grad_out", "rearrange_m_groups", "rearrange", "grad_out scales to blocked", f"({M}, {Nb})", M * Nb, (M + 128 * G) * Nb, 0, None, 19.0, True),
        (dA, "rearrange_w_t", "rearrange_3d", "rearrange", "B scales to blocked", f"({G}, {K}, {Nb})", G * K * Nb, G * K * Nb, 0, None, 12.0, False),
        (dA, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 3D scaled grouped GEMM", f"({M}, {N}) @ ({G}, {N}, {K})", *gemm(M, K, N), MX_GEMM_US[dA], True),
        (dB, "quantize_grad_out_t", "quantize_dim1", "quantize", "Quantize grad_out along M", f"({M}, {N})", *_quant(M, N), 0, None, 141.0, True),
        (dB, "quantize_a_t", "quantize_dim1", "quantize", "Quantize A along M", f"({M}, {K})", *_quant(M, K), 0, None, 472.0, True),
        (dB, "rearrange_grad_out_t", "rearrange_k_groups", "rearrange", "grad_out_t scales to blocked", f"({N}, {Mb})", N * Mb, N * (Mb + 4 * G), 0, None, 200.0, True),
        (dB, "rearrange_a_t", "rearrange_k_groups", "rearrange", "A_t scales to blocked", f"({K}, {Mb})", K * Mb, K * (Mb + 4 * G), 0, None, 208.0, True),
        (dB, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 2D scaled grouped GEMM", f"({N}, {M}) @ ({M}, {K})", *gemm(N, K, M), MX_GEMM_US[dB], True),
    ]  # fmt: skip


def bf16_stages(M: int) -> list[tuple]:
    gemm = (2 * (M * K + G * N * K), 2 * M * N, 2 * M * N * K, "bf16")
    return [
        (p, "gemm", "grouped_mm", "gemm", "bf16 grouped GEMM", "", *gemm, us, True) for p, us in BF16_GEMM_US.items()
    ]


def spread(t: float) -> list[float]:
    """Five samples with median t and inclusive-quartile IQR 0.01 t."""
    return [t * 0.99, t * 0.995, t, t * 1.005, t * 1.01]


def synthetic_run(Ms=MS, power_limits=(None,), card="NVIDIA B200", model=False, errors=(), hardware="b200") -> Run:
    """mxfp8 stages, bf16 GEMMs and both end-to-end rows at every M and power limit.

    A power limit L slows every stage by 1000 / L and reports an SM clock of 1.98 * L MHz and a 700 W draw.
    ``errors``: stage names whose mxfp8 rows become error rows. ``model``: model rows instead of samples.
    """
    records = []
    for limit in power_limits:
        slow = 1.0 if limit is None else 1000.0 / limit
        telemetry = {} if limit is None else {"sm_clock_mhz": 1.98 * limit}
        for M in Ms:
            s = M / 131072
            for recipe, stages, e2e in (("mxfp8", mxfp8_stages(M), MX_E2E_US), ("bf16", bf16_stages(M), BF16_E2E_US)):
                point = Point(M, N, K, G, recipe=recipe, power_limit_w=limit)
                e2e_row = ("end_to_end", "fwd+bwd", f"{recipe} autograd", "end_to_end", "fwd+bwd", "", 0, 0, 6 * M * N * K, None, e2e, True)  # fmt: skip
                for *cols, us, scales in [*stages, e2e_row]:
                    t = us * (s if scales else 1.0) * slow
                    fields = {"samples_us": spread(t)} if not model else {"measured": False, "model_us": t}
                    if recipe == "mxfp8" and cols[1] in errors:
                        fields = {"error": "RuntimeError: CUDA error: an illegal memory access\nmore lines"}
                    tel = {**telemetry, "energy_j_per_call": 700.0 * t * 1e-6} if telemetry else {}
                    records.append(Record(point, *cols, backend="triton", method="graph", telemetry=tel, **fields))
    meta = {"card": card, "hardware": hardware, "command": "mxbench roofline --K 7168 --N 2048", "mxbench": "0.1.0",
            "git_commit": "abc1234", "measured": not model, "timing": {"cold_l2": True, "samples": 5}}  # fmt: skip
    return Run(meta=meta, records=records)


BREAKDOWN_COLUMNS = ["Pass", "Kernel", "Purpose", "Input shape", "Time (us)", "IQR (us)", "GB/s", "TFLOP/s", "Efficiency"]  # fmt: skip


# ---------------------------------------------------------------------------------------------- breakdown


def test_breakdown_is_the_seed_table_at_the_largest_M():
    rows = tables.breakdown_rows(synthetic_run(), tables.TableOptions(peaks=PEAKS))
    assert len(rows) == 15 and list(rows[0]) == BREAKDOWN_COLUMNS
    assert [r["Pass"] for r in rows] == ["Forward"] * 5 + ["Backward (dA)"] * 5 + ["Backward (dB)"] * 5
    qa = rows[0]
    assert (qa["Kernel"], qa["Input shape"], qa["Time (us)"], qa["IQR (us)"]) == (
        "quantize_dim0", "(131072, 7168)", "500.0", "5.0",
    )  # fmt: skip
    # 2,847,932,416 B in 500 us = 5695.9 GB/s = 71.2% of 8 TB/s
    assert qa["GB/s"] == "5696" and qa["Efficiency"] == "71.2% of B200 datasheet BW" and qa["TFLOP/s"] is None
    gemm = rows[4]
    # 2*131072*2048*7168 FLOP in 1000 us = 3848.3 TFLOP/s = 85.5% of 4500
    assert gemm["TFLOP/s"] == "3848.3" and gemm["Efficiency"] == "85.5% of B200 datasheet mxfp8"
    assert gemm["GB/s"] is None


def test_breakdown_at_a_chosen_M_and_pass():
    rows = tables.breakdown_rows(synthetic_run(), tables.TableOptions(M=16384, passes="backward_weight", peaks=PEAKS))
    assert [r["Pass"] for r in rows] == ["Backward (dB)"] * 5
    assert rows[1]["Time (us)"] == "59.0"  # 472 us * 16384 / 131072
    assert rows[1]["Input shape"] == "(16384, 7168)"


def test_breakdown_of_the_baseline_only_on_request():
    rows = tables.breakdown_rows(synthetic_run(), tables.TableOptions(recipe="bf16", peaks=PEAKS))
    assert [r["Kernel"] for r in rows] == ["grouped_mm"] * 3
    # 3848.3 TFLOP in 2000 us = 1924.1 TFLOP/s = 85.5% of 2250
    assert rows[0]["Efficiency"] == "85.5% of B200 datasheet bf16"


def test_breakdown_marks_model_rows():
    rows = tables.breakdown_rows(synthetic_run(model=True), tables.TableOptions(peaks=PEAKS))
    assert all(r["IQR (us)"] == render.MODEL_MARK for r in rows)
    assert rows[0]["Time (us)"] == "500.0"


def test_breakdown_shows_errors_in_place_of_times():
    rows = tables.breakdown_rows(synthetic_run(errors=("gemm",)), tables.TableOptions(passes="forward", peaks=PEAKS))
    gemm = rows[4]
    assert gemm["Time (us)"] == "error: RuntimeError: CUDA error: an illegal memory access"
    assert gemm["Efficiency"] is None and gemm["TFLOP/s"] is None


def test_breakdown_names_power_limits_when_they_vary():
    run = synthetic_run(power_limits=(1000.0, 750.0))
    rows = tables.breakdown_rows(run, tables.TableOptions(passes="forward", peaks=PEAKS))
    assert [r["Power limit (W)"] for r in rows] == ["1000"] * 5 + ["750"] * 5


def test_breakdown_without_denominator_leaves_efficiency_blank():
    rows = tables.breakdown_rows(synthetic_run(), tables.TableOptions(denominator=None))
    assert all(r["Efficiency"] is None for r in rows) and rows[0]["GB/s"] == "5696"


def test_a_card_filter_that_matches_nothing_names_the_card_held():
    with pytest.raises(InputError, match="no records with card=NVIDIA H100 80GB HBM3; the run has card in NVIDIA B200"):
        tables.breakdown_rows(synthetic_run(), tables.TableOptions(card="NVIDIA H100 80GB HBM3", peaks=PEAKS))
    options = tables.TableOptions(card="nvidia b200", peaks=PEAKS)
    assert tables.breakdown_rows(synthetic_run(), options)  # without regard to case


def test_unknown_pass_is_rejected():
    with pytest.raises(ValueError, match="passes"):
        tables.breakdown_rows(synthetic_run(), tables.TableOptions(passes="sideways", peaks=PEAKS))


def test_breakdown_takes_the_datasheet_peaks_of_the_run_spec(monkeypatch):
    monkeypatch.setattr(
        tables, "peaks_for_run", lambda run, denominator: {**PEAKS, "bandwidth": Peak(4.0, "TB/s", "X")}
    )
    rows = tables.breakdown_rows(synthetic_run())
    assert rows[0]["Efficiency"] == "142.4% of X"  # 5.696 TB/s of 4.0


# ---------------------------------------------------------------------------------------------- speedup


def test_speedup_rows_net_and_per_gemm():
    rows = tables.speedup_rows(synthetic_run())
    assert [r["M"] for r in rows] == [str(m) for m in MS]
    last = rows[-1]
    assert last["bf16 fwd+bwd (us)"] == "6100.0" and last["Recipe fwd+bwd (us)"] == "4000.0"
    assert last["Net speedup"] == "1.525x"
    assert (last["Fwd GEMM 2Dx3D"], last["dA GEMM 2Dx3D"], last["dB GEMM 2Dx2D"]) == ("2.000x", "2.000x", "1.500x")
    assert last["Recipe"] == "mxfp8" and last["Source"] == "measured"
    assert rows[0]["bf16 fwd+bwd (us)"] == "762.5"  # 6100 / 8


def test_speedup_rows_of_a_model_run_say_so():
    rows = tables.speedup_rows(synthetic_run(model=True), tables.TableOptions(M=131072))
    assert len(rows) == 1 and rows[0]["Net speedup"] == "1.525x" and rows[0]["Source"] == render.MODEL_MARK


def test_speedup_without_a_baseline_is_blank():
    run = synthetic_run()
    run.records = [r for r in run.records if not (r.point.recipe == "bf16" and r.pass_name == "backward_weight")]
    row = tables.speedup_rows(run, tables.TableOptions(M=131072))[0]
    assert row["dB GEMM 2Dx2D"] is None and row["Fwd GEMM 2Dx3D"] == "2.000x"


def test_baseline_matching_ignores_the_scale_mode():
    run = synthetic_run(Ms=(131072,))
    for r in run.records:
        if r.point.recipe == "bf16":
            r.point = Point(r.point.M, N, K, G, recipe="bf16", mode="floor")
    assert tables.speedup_rows(run)[0]["Net speedup"] == "1.525x"


# ---------------------------------------------------------------------------------------------- sweep, power


def test_sweep_rows_hold_every_record():
    run = synthetic_run()
    rows = tables.sweep_rows(run, tables.TableOptions(peaks=PEAKS))
    assert len(rows) == len(run.records) == 4 * (16 + 4)
    assert {r["M"] for r in rows} == {str(m) for m in MS} and {r["Recipe"] for r in rows} == {"mxfp8", "bf16"}
    e2e = [r for r in rows if r["Pass"] == "End to end"]
    assert len(e2e) == 8 and all(r["Efficiency"] is None for r in e2e)


def test_power_rows_per_limit():
    run = synthetic_run(Ms=(131072,), power_limits=(1000.0, 500.0))
    rows = tables.power_rows(run, tables.TableOptions(passes="forward", recipe="mxfp8", peaks=PEAKS))
    qa = [r for r in rows if r["Stage"] == "quantize_a"]
    assert [r["Power limit (W)"] for r in qa] == ["500", "1000"]
    # at 500 W: 500 us * 1000/500 = 1000 us; 700 W for 1000 us = 0.7 J
    assert qa[0]["Time (us)"] == "1000.0" and qa[0]["Energy/call (mJ)"] == "700.000"
    assert qa[0]["SM clock (MHz)"] == "990" and qa[1]["SM clock (MHz)"] == "1980"
    assert qa[0]["Efficiency"] == "35.6% of B200 datasheet BW"  # 2.848 GB in 1000 us of 8 TB/s


# ---------------------------------------------------------------------------------------------- rendering


def small_rows():
    return tables.breakdown_rows(synthetic_run(), tables.TableOptions(passes="forward", peaks=PEAKS))


def test_render_markdown_is_a_pipe_table_with_alignment():
    lines = render.render(small_rows(), "markdown").splitlines()
    assert len(lines) == 2 + 5
    assert [c.strip() for c in lines[0].strip("|").split("|")] == BREAKDOWN_COLUMNS
    assert re.fullmatch(r"\|[-:|]+\|", lines[1]) and ":" in lines[1]
    assert "| Forward " in lines[2] and "71.2% of B200 datasheet BW" in lines[2]


def test_render_github_has_a_plain_rule():
    lines = render.render(small_rows(), "github").splitlines()
    assert re.fullmatch(r"\|[-|]+\|", lines[1])
    assert "—" in lines[6]  # the GEMM row has no GB/s


def test_render_csv_round_trips():
    rows = small_rows()
    parsed = list(csv.reader(io.StringIO(render.render(rows, "csv"))))
    assert parsed[0] == BREAKDOWN_COLUMNS
    assert len(parsed) == 6
    assert parsed[1][BREAKDOWN_COLUMNS.index("Time (us)")] == "500.0"
    assert parsed[5][BREAKDOWN_COLUMNS.index("GB/s")] == ""  # missing cells are empty in csv


def test_render_plain_is_for_terminals():
    text = render.render(small_rows(), "plain")
    assert "|" not in text and text.splitlines()[0].split()[:2] == ["Pass", "Kernel"]


@pytest.mark.parametrize("fmt", render.FORMATS)
def test_render_speedup_in_every_format(fmt):
    text = render.render(tables.speedup_rows(synthetic_run()), fmt)
    assert "1.525x" in text and "1.500x" in text and "Net speedup" in text


def test_render_column_choice():
    text = render.render(small_rows(), "csv", columns=["Time (us)", "Kernel"])
    assert text.splitlines()[:2] == ["Time (us),Kernel", "500.0,quantize_dim0"]
    with pytest.raises(ValueError, match="columns"):
        render.render(small_rows(), "csv", columns=["Nope"])


def test_render_rejects_unknown_format():
    with pytest.raises(ValueError, match="fmt"):
        render.render(small_rows(), "html")


def test_header_block_names_card_denominators_version_and_command():
    text = render.header_block(synthetic_run(), PEAKS)
    assert "NVIDIA B200" in text and "B200 datasheet BW (8 TB/s)" in text and "B200 datasheet mxfp8 (4500" in text
    assert "0.1.0, commit abc1234" in text and "`mxbench roofline --K 7168 --N 2048`" in text


def test_header_block_of_a_model_run():
    assert "b200 (model, not measured)" in render.header_block(synthetic_run(model=True), PEAKS)


def test_table_front_door(monkeypatch):
    monkeypatch.setattr(tables, "peaks_for_run", lambda run, denominator: PEAKS)
    md = front_door.table(synthetic_run(), "breakdown", "markdown", passes="forward")
    assert md.startswith("- **Card:** NVIDIA B200") and "| Forward" in md
    csv_text = front_door.table(synthetic_run(), "breakdown", "csv", passes="forward", columns=["Kernel"])
    assert csv_text.splitlines()[0] == "Kernel"
    assert "Net speedup" in front_door.table(synthetic_run(), "speedup", "plain")
    with pytest.raises(ValueError, match="kind"):
        front_door.table(synthetic_run(), "pie")


def test_speedups_refuse_a_pass():
    # a speedup compares whole steps: a pass filter would drop their end-to-end rows and leave a table of blanks
    with pytest.raises(InputError, match="no pass to choose"):
        tables.speedup_rows(synthetic_run(), tables.TableOptions(passes="forward"))
