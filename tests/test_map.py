"""``mxbench map`` on a CPU: the model's grid, file, table and figures hold the same numbers, each recomputed here
from the stored records by hand; the measured path (a fake GPU's timings through the step's StageTimer, the
layer's timer per cell) stores every cell's samples; a bad grid is refused before any work; Ctrl-C keeps the cells
measured; compare gives per-cell verdicts on two map runs."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest
from click.testing import CliRunner
from helpers import FakeGPU, FakeTiming
from PIL import Image

from mxbench.cli import cli
from mxbench.clikit import common
from mxbench.instruments.kit import Instruments
from mxbench.storage.results import load_run, save_run


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def fwd_bwd(payload: dict, recipe: str, M: int, G: int) -> float:
    """The forward + backward time of ``recipe`` at the cell of rows M and G experts, read by hand from a stored
    run's JSON: the median of its samples, else its model time."""
    found = [r for r in payload["records"] if r["stage"] == "fwd+bwd" and r["point"]["recipe"] == recipe
             and r["point"]["M"] == M and r["point"]["G"] == G and not r.get("error")]  # fmt: skip
    assert len(found) == 1, (recipe, M, G, len(found))
    r = found[0]
    return statistics.median(r["samples_us"]) if r["samples_us"] else r["model_us"]


def markdown_cells(text: str, heading_start: str) -> dict[tuple[str, str], str]:
    """The cells of the markdown table under the heading that starts with ``heading_start``: (G, column) -> text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"**{heading_start}"))
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip("|").split("|")])
        elif table:
            break
    header, body = table[0], [row for row in table[1:] if not set("".join(row)) <= set(":-")]
    return {(row[0], col): cell for row in body for col, cell in zip(header[1:], row[1:], strict=True)}


# ---------------------------------------------------------------------------------------------------- the model


def test_model_map_grid_file_table_and_figure_hold_the_same_speedups(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    out, plots = tmp_path / "map.json", tmp_path / "plots"
    result = invoke("map", "--preset", "qwen3-30b-a3b", "--experts", "8,32", "--tokens-per-expert", "256,1024",
                    "--recipe", "fp8_rowwise", "--out", out, "--plot-dir", plots)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "model, not measured" in result.output
    payload = json.loads(out.read_text())
    meta = payload["meta"]
    assert meta["kind"] == "map" and meta["measured"] is False
    # the cells by hand: top-8, so T = tokens per expert x G / 8 and rows = 8 T
    assert meta["map"]["cells"] == [
        {"G": 8, "value": 256, "tokens": 256, "rows": 2048}, {"G": 8, "value": 1024, "tokens": 1024, "rows": 8192},
        {"G": 32, "value": 256, "tokens": 1024, "rows": 8192}, {"G": 32, "value": 1024, "tokens": 4096, "rows": 32768},
    ]  # fmt: skip
    assert {(r["point"]["recipe"], r["point"]["M"], r["point"]["G"]) for r in payload["records"]} == {
        (recipe, rows, G) for recipe in ("bf16", "fp8_rowwise") for rows, G in ((2048, 8), (8192, 8), (8192, 32),
                                                                                 (32768, 32))}  # fmt: skip
    expected = {(G, v): fwd_bwd(payload, "bf16", c["rows"], G) / fwd_bwd(payload, "fp8_rowwise", c["rows"], G)
                for c in meta["map"]["cells"] for G, v in [(c["G"], c["value"])]}  # fmt: skip
    assert len({round(x, 4) for x in expected.values()}) == 4  # the cells differ: a swapped cell would show

    table = invoke("table", out, "--kind", "map")
    assert table.exit_code == 0, table.output
    cells = markdown_cells(table.output, "fp8_rowwise forward + backward speedup")
    assert cells == {(str(G), str(v)): f"{x:.2f}x" for (G, v), x in expected.items()}
    assert "model, not measured" in table.output.split("**fp8_rowwise")[1].split("\n")[0]
    from mxbench.workloads.map.speedups import crossing
    from mxbench.workloads.map.tables import break_even_text
    rows = [break_even_text(crossing((256, 1024), [expected[(G, 256)], expected[(G, 1024)]]), (256, 1024))
            for G in (8, 32)]  # fmt: skip
    assert f"1.0x reached at (tokens per expert, log-interpolated): G=8: {rows[0]}; G=32: {rows[1]}" in table.output

    figure = plots / "map-fp8_rowwise.png"
    assert f"figure: {figure}" in result.output
    data = json.loads(Image.open(figure).text["mxbench-map"])
    assert data["experts"] == [8, 32] and data["values"] == [256, 1024] and data["measured"] is False
    assert data["speedup"] == [[pytest.approx(expected[(G, v)]) for v in (256, 1024)] for G in (8, 32)]


@pytest.mark.parametrize("row, expected", [
    ([0.5, 0.75, 1.0], "~2048"),            # reached exactly at the last cell
    ([0.8, 1.2, 1.5], "~724"),              # halfway in log2 between 512 and 1024: 2 ** 9.5 = 724.08
    ([0.9, 0.95, 1.15], "~1218"),           # a quarter of the way from 1024 to 2048: 2 ** 10.25 = 1217.7
    ([1.0, 1.1, 1.2], "<= 512"),            # the line lies below the grid
    ([0.5, 0.6, 0.99], "> 2048"),           # no cell reaches 1.0x
    ([0.5, None, 1.2], "unknown"),          # a missing cell before the crossing
    ([1.3, None, None], "<= 512"),          # reached before any missing cell
])
def test_where_a_row_reaches_break_even_by_hand(row, expected):
    from mxbench.workloads.map.speedups import crossing
    from mxbench.workloads.map.tables import break_even_text
    assert break_even_text(crossing((512, 1024, 2048), row), (512, 1024, 2048)) == expected


def test_the_heatmap_artists_hold_the_cells_and_the_break_even_contour(tmp_path, monkeypatch):
    """The drawn figure itself: the image's array is the speedups (rows G, columns tokens), each cell's text its
    value, and a contour at exactly 1.0 where the map crosses it."""
    from mxbench.workloads.map.figure import map_figure
    from mxbench.workloads.map.speedups import map_view

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    out = tmp_path / "map.json"
    result = invoke("map", "--K", 2880, "--N", 2880, "--top-k", 4, "--experts", "8,32", "--tokens-per-expert",
                    "512,8192", "--recipe", "fp8_rowwise", "--out", out, "--plot-dir", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    rows = {(G, v): v * G for G in (8, 32) for v in (512, 8192)}  # top-4: T = v G / 4 tokens, 4 T rows
    expected = [[fwd_bwd(payload, "bf16", rows[G, v], G) / fwd_bwd(payload, "fp8_rowwise", rows[G, v], G)
                 for v in (512, 8192)] for G in (8, 32)]  # fmt: skip
    assert min(map(min, expected)) < 1.0 < max(map(max, expected))  # the B200 model crosses 1.0x on this grid
    fig = map_figure(map_view(load_run(out)), "fp8_rowwise", "b200 (model, not measured)")
    ax = fig.axes[0]
    assert ax.images[0].get_array().tolist() == [[pytest.approx(x) for x in row] for row in expected]
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{x:.2f}x" for row in expected for x in row)
    contours = [c for c in ax.collections if hasattr(c, "levels")]
    assert len(contours) == 1 and list(contours[0].levels) == [1.0]
    assert "model, not measured" in ax.get_title()


# ------------------------------------------------------------------------------------------------ bad grids


QWEN = ["--preset", "qwen3-30b-a3b"]


@pytest.mark.parametrize("args, message", [
    (QWEN + ["--experts", ","], "'--experts': ',': give at least one value"),
    (QWEN + ["--tokens-per-expert", "256,0"], "must be positive integers"),
    (QWEN + ["--tokens", ","], "'--tokens': ',': give at least one value"),
    (["--K", "48", "--N", "64"], "K must be a positive multiple of 32"),
    (["--K", "64", "--N", "0"], "N must be a positive multiple of 32"),
    (QWEN + ["--experts", "8,600"], "at most 512"),
    (QWEN + ["--experts", "4,8"], "at least the layer's top-k (8"),
    (QWEN + ["--experts", "8,16,32,64,128,256,384,512", "--tokens-per-expert", "1,2,3,4,5,6,7,8,9"], "72 cells"),
    (QWEN + ["--experts", "512", "--tokens-per-expert", str(2**23)], "past 2147483647"),
    (QWEN + ["--tokens", "1024", "--tokens-per-expert", "256"], "not both"),
    (QWEN + ["--recipe", "bf16"], "besides bf16"),
    (QWEN + ["--backend", "triton_ws", "--recipe", "fp8_rowwise"], "timed on a GPU"),
    (QWEN + ["--backend", "nope", "--recipe", "fp8_rowwise"], "backends are"),
    (QWEN + ["--scope", "projection", "--top-k", "2"], "no router"),
    (["--preset", "mixtral-8x7b"], "no [layer] section"),
    (["--K", "65536", "--N", "65536", "--experts", "512", "--tokens-per-expert", "1"], "GB of the largest card"),
])  # fmt: skip
def test_a_bad_grid_is_refused_before_any_work(args, message, tmp_path, monkeypatch):
    from mxbench.workloads.map import measure

    def no_work(*a, **k):
        raise AssertionError("the map started work on a bad grid")

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    monkeypatch.setattr(measure, "model_map_run", no_work)
    monkeypatch.setattr(measure, "run_map", no_work)
    result = invoke("map", *args, "--out", tmp_path / "x.json", "--plot-dir", tmp_path / "plots")
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "plots").exists()


def test_the_cells_of_each_scope_and_token_axis():
    """Hand-worked cells: at the layer (top-3) tokens per expert v at G experts take ceil(v G / 3) tokens and three
    times as many rows; a total of T tokens, T and 3 T; at the projection, M = v G rows or the total asked."""
    from mxbench.workloads.map.grid import Grid, LayerModel

    top3 = LayerModel(3, 0, "softmax")
    cells = {s: Grid(64, 64, (4, 8), (10, 100), *s, top3).cells() for s in (
        ("layer", "tokens_per_expert"), ("layer", "tokens"), ("projection", "tokens_per_expert"),
        ("projection", "tokens"))}  # fmt: skip
    as_tuples = {s: [(c.G, c.value, c.tokens, c.rows) for c in cs] for s, cs in cells.items()}
    assert as_tuples[("layer", "tokens_per_expert")] == [(4, 10, 14, 42), (4, 100, 134, 402), (8, 10, 27, 81),
                                                         (8, 100, 267, 801)]  # fmt: skip
    assert as_tuples[("layer", "tokens")] == [(4, 10, 10, 30), (4, 100, 100, 300), (8, 10, 10, 30), (8, 100, 100, 300)]
    assert as_tuples[("projection", "tokens_per_expert")] == [(4, 10, 40, 40), (4, 100, 400, 400), (8, 10, 80, 80),
                                                              (8, 100, 800, 800)]  # fmt: skip
    assert as_tuples[("projection", "tokens")] == [(4, 10, 10, 10), (4, 100, 100, 100), (8, 10, 10, 10),
                                                   (8, 100, 100, 100)]  # fmt: skip


# ----------------------------------------------------------------------------------------------- measured


class VaryingGPU(FakeGPU):
    """A fake GPU whose every timing differs (the n-th timed call takes 10 + 7 n us, +0.1% per sample), so each
    cell's speedup differs and a record read from the wrong cell shows."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def time_fn(self, fn, *, cold_l2, use_graph, samples, window=None):
        timing = super().time_fn(fn, cold_l2=cold_l2, use_graph=use_graph, samples=samples, window=window)
        self.calls += 1
        us = 10.0 + 7.0 * self.calls
        return FakeTiming([us * (1 + 0.001 * i) for i in range(samples)], calls_per_replay=timing.calls_per_replay)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """`mxbench map` on a fake GPU: the real plan and StageTimer, VaryingGPU's timings."""
    holder = {"gpu": VaryingGPU()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(common, "card_name", lambda device=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(Instruments, "real", classmethod(lambda cls, *a, **k: holder["gpu"].instruments()))
    return holder


PROJECTION = ["map", "--K", "256", "--N", "128", "--scope", "projection", "--experts", "2,4", "--tokens-per-expert",
              "32,64", "--recipe", "mxfp8", "--samples", "5"]  # fmt: skip


def test_a_measured_projection_map_stores_every_cells_samples(fake_gpu, tmp_path):
    result = invoke(*PROJECTION, "--out", "m.json")
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "m.json").read_text())
    assert payload["meta"]["measured"] is True and payload["meta"]["map"]["scope"] == "projection"
    steps = [r for r in payload["records"] if r["stage"] == "fwd+bwd"]
    assert len(steps) == 8 and all(len(r["samples_us"]) == 5 for r in steps)  # 4 cells x (bf16, mxfp8)
    assert any(r["stage"] == "quantize_a" for r in payload["records"])  # every stage of the step, as roofline's
    cells = markdown_cells(invoke("table", "m.json", "--kind", "map").output, "mxfp8 forward + backward speedup")
    for G in (2, 4):
        for v in (32, 64):
            expected = fwd_bwd(payload, "bf16", G * v, G) / fwd_bwd(payload, "mxfp8", G * v, G)
            assert cells[(str(G), str(v))] == f"{expected:.2f}x"
    figures = sorted((tmp_path / "plots" / "nvidia-h100-80gb-hbm3").glob("*.png"))
    assert [f.name.endswith("-mxfp8.png") for f in figures] == [True]
    data = json.loads(Image.open(figures[0]).text["mxbench-map"])
    assert data["measured"] is True and data["speedup"][1][0] == pytest.approx(
        fwd_bwd(payload, "bf16", 128, 4) / fwd_bwd(payload, "mxfp8", 128, 4))


def test_ctrl_c_mid_sweep_keeps_the_cells_done(fake_gpu, tmp_path):
    def stop(n):
        if n == 5:  # points 0-4: cells (2, 32), (2, 64) whole and bf16 of (4, 32)
            raise KeyboardInterrupt

    fake_gpu["gpu"] = VaryingGPU(on_point=stop)
    result = invoke(*PROJECTION, "--out", "m.json")
    assert result.exit_code == 130, result.output
    run = load_run(tmp_path / "m.json")
    assert run.meta["interrupted"] is True and "after 5 of 8 points" in run.meta["partial"]
    done = {(r.point.recipe, r.point.M, r.point.G) for r in run.records if r.stage == "fwd+bwd"}
    assert done == {("bf16", 64, 2), ("mxfp8", 64, 2), ("bf16", 128, 2), ("mxfp8", 128, 2), ("bf16", 128, 4)}
    cells = markdown_cells(invoke("table", "m.json", "--kind", "map").output, "mxfp8 forward + backward speedup")
    payload = json.loads((tmp_path / "m.json").read_text())
    assert cells[("2", "32")] == f"{fwd_bwd(payload, 'bf16', 64, 2) / fwd_bwd(payload, 'mxfp8', 64, 2):.2f}x"
    assert cells[("4", "32")] == cells[("4", "64")] == "—"
    assert "Partial" in invoke("table", "m.json", "--kind", "map").output
    figure = next((tmp_path / "plots" / "nvidia-h100-80gb-hbm3").glob("*.png"))
    assert json.loads(Image.open(figure).text["mxbench-map"])["speedup"][1] == [None, None]


def test_the_layer_scope_hands_each_cell_its_own_layer(tmp_path):
    """At the layer each cell's points go to the layer's timer bound to that cell's LayerShape (a stand-in here:
    the real one runs the layer on a GPU), and its records are stored as the cell's."""
    from mxkernels.stages.layer import LayerShape

    from mxbench.measuring.stages import SweepOptions, stage_record
    from mxbench.workloads.map.grid import Grid, LayerModel
    from mxbench.workloads.map.measure import run_map

    made = []

    class StandIn:
        def __init__(self, options, ins, shape):
            made.append(shape)
            self.shape = shape

        def measure(self, point):
            from mxkernels.core.cost import Cost

            from mxbench.measuring.stages import EndToEnd

            step = EndToEnd(point.recipe, ((self.shape.T, self.shape.K),), Cost(0, 0))
            us = float(self.shape.T) * (2.0 if point.recipe == "bf16" else 1.0)
            return [stage_record(point, step, samples_us=[us, us, us])]

    grid = Grid(64, 64, (4, 6), (32, 96), "layer", "tokens_per_expert", LayerModel(3, 1, "softmax"), "toy")
    points = grid.all_points(["mxfp8"])
    run = run_map(grid, points, ["mxfp8"], SweepOptions(samples=3, out=tmp_path / "m.json"),
                  VaryingGPU().instruments(), progress=False, layer_timer=StandIn)  # fmt: skip
    # one timer per cell, each with T = ceil(tokens per expert x G / top-k) (32 x 4 / 3 = 42.7: 43 tokens), E = G,
    # the layer's top-k, shared experts and scores
    assert made == [LayerShape(T, 64, 64, G, 3, 1, "softmax") for G, T in ((4, 43), (4, 128), (6, 64), (6, 192))]
    stored = load_run(tmp_path / "m.json")
    assert {(r.point.M, r.point.G, r.samples_us[0]) for r in stored.records if r.point.recipe == "mxfp8"} == {
        (129, 4, 43.0), (384, 4, 128.0), (192, 6, 64.0), (576, 6, 192.0)}  # fmt: skip
    assert run.meta["map"]["top_k"] == 3 and run.meta["kind"] == "map"


# ------------------------------------------------------------------------------------------------ compare


def test_compare_on_two_map_runs_gives_per_cell_verdicts_and_fails_on_a_slower_cell(fake_gpu, tmp_path):
    assert invoke(*PROJECTION, "--out", "base.json").exit_code == 0
    base = load_run(tmp_path / "base.json")
    same = invoke("compare", "base.json", "base.json")
    assert same.exit_code == 0, same.output
    # one cell's mxfp8 forward + backward 1.5x slower, every other record as it was
    slow = replace(base, records=[replace(r, samples_us=[u * 1.5 for u in r.samples_us])
                                  if (r.stage, r.point.recipe, r.point.M, r.point.G) == ("fwd+bwd", "mxfp8", 256, 4)
                                  else r for r in base.records])  # fmt: skip
    slow.meta = dict(base.meta)
    save_run(slow, tmp_path / "slow.json")
    result = invoke("compare", "base.json", "slow.json", "--format", "csv")
    assert result.exit_code == 1, result.output
    rows = [line.split(",") for line in result.output.splitlines() if line.startswith("M=")]
    slower = [row for row in rows if "SLOWER" in row]
    assert len(slower) == 1 and slower[0][0].startswith("M=256 N=128 K=256 G=4 mxfp8") and "fwd+bwd" in slower[0]
    steps = [row for row in rows if "fwd+bwd" in row]
    assert len(steps) == 8  # a verdict for every cell's bf16 and mxfp8 forward + backward


def test_regress_re_measures_a_map_baseline_cell_by_cell(fake_gpu, tmp_path):
    """`mxbench regress` of a map baseline re-measures its grid's points through the map's own timer: the same
    timings pass; every stage 1.5x slower fails, naming the cells' forward + backward."""
    fake_gpu["gpu"] = FakeGPU(us=10.0)
    assert invoke(*PROJECTION, "--out", "base.json").exit_code == 0
    same = invoke("regress", "--baseline", "base.json", "--rounds", "1", "--out", "fresh.json")
    assert same.exit_code == 0, same.output
    fresh = load_run(tmp_path / "fresh.json")  # measured as a map (its grid in its metadata), not as a sweep
    assert fresh.meta["kind"] == "map"
    assert fresh.meta["map"]["cells"] == load_run(tmp_path / "base.json").meta["map"]["cells"]
    fake_gpu["gpu"] = FakeGPU(us=15.0)
    slower = invoke("regress", "--baseline", "base.json", "--rounds", "1", "--format", "csv")
    assert slower.exit_code == 1, slower.output
    steps = [line for line in slower.output.splitlines() if ",fwd+bwd," in line]
    assert len(steps) == 8 and all("SLOWER" in line for line in steps)
    assert {line.split(",")[0].split(" G=")[1].split()[0] for line in steps} == {"2", "4"}


@pytest.mark.gpu
def test_a_measured_layer_map_on_the_gpu(tmp_path):
    """The layer's own measurement at every cell on a real GPU: samples stored for every cell's forward + backward,
    no error row, the table's speedups those of the stored samples."""
    out = tmp_path / "map.json"
    result = invoke("map", "--K", 256, "--N", 128, "--experts", "2,4", "--tokens-per-expert", "128,256", "--top-k", 2,
                    "--recipe", "fp8_rowwise", "--samples", 3, "--out", out, "--plot-dir", tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert payload["meta"]["measured"] is True and not [r for r in payload["records"] if r.get("error")]
    steps = [r for r in payload["records"] if r["stage"] == "fwd+bwd"]
    assert len(steps) == 8 and all(len(r["samples_us"]) == 3 and r["telemetry"]["sqnr_db"] for r in steps)
    cells = markdown_cells(invoke("table", out, "--kind", "map").output, "fp8_rowwise forward + backward speedup")
    for c in payload["meta"]["map"]["cells"]:
        expected = fwd_bwd(payload, "bf16", c["rows"], c["G"]) / fwd_bwd(payload, "fp8_rowwise", c["rows"], c["G"])
        assert cells[(str(c["G"]), str(c["value"]))] == f"{expected:.2f}x"
