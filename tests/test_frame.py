"""The frame of stored runs (``mxbench.load``) against the committed H200 runs' JSON, read here with the json module
alone: counts, values, the derived columns recomputed, the samples frame, and the one record selection every table
shares (a filter that matches nothing says what the file holds)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest
from helpers import committed_results
from mxkernels.core.errors import InputError

import mxbench
from mxbench.views import frame
from mxbench.storage.results import Point, Record, Run

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "nvidia-h200"
DEEPSEEK = RESULTS / "roofline-deepseek-v3.json"
PEERS = RESULTS / "peers-deepseek-v3.json"


def raw(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def deepseek() -> pd.DataFrame:
    return mxbench.load(DEEPSEEK)


def test_every_documented_column_and_nothing_else(deepseek):
    assert list(deepseek.columns) == list(frame.COLUMNS)
    assert all(text.strip() for text in frame.COLUMNS.values())


def test_one_row_per_record_in_stored_order(deepseek):
    records = raw(DEEPSEEK)["records"]
    assert len(deepseek) == len(records) == 80
    assert list(deepseek["record"]) == list(range(80))
    assert list(deepseek["M"]) == [r["point"]["M"] for r in records]
    assert list(deepseek["bytes_read"]) == [r["bytes_read"] for r in records]
    assert (deepseek["file"] == str(DEEPSEEK)).all() and (deepseek["card"] == "NVIDIA H200").all()
    assert (deepseek["commit"] == "755e51bb04c01a707994f3ab4065ac0cea4a4df2").all()
    assert deepseek["date"].iloc[0] == pd.Timestamp("2026-11-26T03:46:21+00:00")


def test_times_are_the_medians_and_spreads_of_the_samples(deepseek):
    records = raw(DEEPSEEK)["records"]
    for i in (0, 4, 37, 79):
        samples = records[i]["samples_us"]
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        row = deepseek.iloc[i]
        assert row["median_us"] == statistics.median(samples) and row["samples"] == len(samples)
        assert row["iqr_us"] == pytest.approx(q3 - q1, rel=1e-12)
        assert (row["min_us"], row["max_us"]) == (min(samples), max(samples))


def test_derived_columns_recomputed_from_the_json(deepseek):
    records = raw(DEEPSEEK)["records"]
    meta = raw(DEEPSEEK)["meta"]
    qa = records[0]  # forward quantize_a at M=16384: memory bound
    us = statistics.median(qa["samples_us"])
    moved = qa["bytes_read"] + qa["bytes_written"]
    row = deepseek.iloc[0]
    assert row["stage"] == "quantize_a" and row["bytes"] == moved
    assert row["gbps"] == pytest.approx(moved / us / 1e3, rel=1e-12)
    assert row["eff_datasheet_pct"] == pytest.approx(100 * moved / us / 1e6 / 4.8, rel=1e-12)  # H200: 4.8 TB/s
    assert row["peak_datasheet"] == "H200 SXM datasheet 4.8 TB/s"
    measured = meta["ceilings"]["bandwidth_tbps"]
    assert row["eff_measured_pct"] == pytest.approx(100 * moved / us / 1e6 / measured, rel=1e-12)
    gemm = deepseek[(deepseek["category"] == "gemm") & (deepseek["recipe"] == "mxfp8")].iloc[0]
    g = records[int(gemm["record"])]
    g_us = statistics.median(g["samples_us"])
    assert gemm["tflops"] == pytest.approx(g["flops"] / g_us / 1e6, rel=1e-12)
    assert gemm["flop_per_byte"] == pytest.approx(g["flops"] / (g["bytes_read"] + g["bytes_written"]), rel=1e-12)
    # an mxfp8 GEMM on a card without MX tensor cores is shown against the fp8 roof, and says so
    assert gemm["eff_datasheet_pct"] == pytest.approx(100 * g["flops"] / g_us / 1e6 / 1979, rel=1e-12)
    assert gemm["peak_datasheet"].endswith("(no mxfp8 peak: fp8 roof)")
    e2e = deepseek[deepseek["category"] == "end_to_end"]
    assert e2e["eff_datasheet_pct"].isna().all() and e2e["peak_datasheet"].isna().all()


def test_a_folder_loads_every_run_in_it_and_passes_over_the_ceilings_store():
    runs = [p for p in committed_results() if p.parent == RESULTS and "records" in raw(p)]
    df = mxbench.load(RESULTS)
    df = df[df["file"].isin([str(p) for p in runs])]  # a run the user made in this folder is theirs, not the test's
    assert len(runs) >= 8 and (RESULTS / "ceilings.json").exists()  # the roofline, peers, layer and map runs
    assert df.groupby("file").size().to_dict() == {str(p): len(raw(p)["records"]) for p in runs}
    assert set(df["run_kind"]) == {"roofline", "peers", "layer", "map"}
    peers = df[df["file"] == str(PEERS)]
    assert sorted(set(peers["impl"])) == ["mxkernels", "torch.compile", "torchao"]
    assert set(peers.loc[peers["impl"] == "torchao", "impl_version"]) == {"0.17.0"}  # recorded by the peers run
    assert df.attrs["runs"][str(DEEPSEEK)]["command"] == raw(DEEPSEEK)["meta"]["command"]


def test_no_stored_run_reads_above_a_measured_denominator():
    # Every card's stored runs, each against its own measured ceilings (held by its own fastest stages).
    runs = [p for p in committed_results() if p.parent.name != "tuning" and "records" in raw(p)]
    df = mxbench.load(runs)
    measured = df["eff_measured_pct"].dropna()
    assert len(measured) > 100 and set(df.card) >= {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    assert measured.max() <= 100.0 + 1e-9, df.loc[measured.idxmax(), ["file", "stage", "eff_measured_pct"]]


def test_a_run_names_each_implementations_version_and_commit():
    p = Point(1024, 256, 512, 4)
    run = Run(meta={"card": "X", "implementations": {"mxkernels": {"version": "0.1.0", "commit": "abc"}}},
              records=[Record(p, "forward", "quantize_a", "k", "quantize", samples_us=[1.0]),
                       Record(p, "forward", "quantize_a", "k", "quantize", impl="theirs", samples_us=[2.0])])  # fmt: skip
    df = frame.frame_of(run)
    assert df["impl_version"].iloc[0] == "0.1.0" and df["impl_commit"].iloc[0] == "abc"
    assert df[["impl_version", "impl_commit"]].iloc[1].isna().all()  # an implementation the run did not describe
    assert df["file"].isna().all() and df["hardware"].isna().all() and df["eff_datasheet_pct"].isna().all()


def test_samples_long_format_joins_the_records():
    samples = mxbench.load_samples(DEEPSEEK)
    records = raw(DEEPSEEK)["records"]
    assert len(samples) == sum(len(r["samples_us"]) for r in records)
    first = samples[samples["record"] == 3]
    assert list(first["us"]) == records[3]["samples_us"] and list(first["sample"]) == list(range(25))
    assert (first["stage"] == records[3]["stage"]).all()
    # from a filtered frame: only its records' samples, whose medians are the frame's
    df = mxbench.load(DEEPSEEK)
    gemms = df[df["category"] == "gemm"]
    picked = mxbench.load_samples(gemms)
    assert sorted(set(picked["record"])) == sorted(gemms["record"])
    medians = picked.groupby("record")["us"].median()
    assert medians.to_dict() == pytest.approx(gemms.set_index("record")["median_us"].to_dict(), rel=1e-12)


def test_load_refuses_what_is_not_there(tmp_path):
    with pytest.raises(InputError, match="no such file or folder"):
        mxbench.load(tmp_path / "nope.json")
    with pytest.raises(InputError, match="no results files"):
        mxbench.load(tmp_path)


@pytest.mark.parametrize(
    "filters, message",
    [
        ({"M": 12345}, f"no records with M=12345; {DEEPSEEK} has M in 16384, 32768, 65536, 131072"),
        ({"recipe": "nvfp4"}, f"no records with recipe=nvfp4; {DEEPSEEK} has recipe in bf16, mxfp8"),
        ({"card": "NVIDIA B200"}, f"no records with card=NVIDIA B200; {DEEPSEEK} has card in NVIDIA H200"),
        ({"recipe": "bf16", "passes": "end_to_end", "M": [16384, 7]},
         "no records with M=7 (pass=end_to_end, recipe=bf16); "),
        ({"passes": "sideways"}, "passes: unknown pass ['sideways']"),
    ],
)  # fmt: skip
def test_a_filter_that_matches_nothing_names_what_the_file_holds(deepseek, filters, message):
    with pytest.raises(InputError) as e:
        frame.select(deepseek, **filters)
    assert str(e.value).startswith(message)


def test_filters_select_and_narrow(deepseek):
    chosen = frame.select(deepseek, M=[16384, 131072], recipe="bf16", card="nvidia h200")
    assert len(chosen) == 2 * 4 and set(chosen["M"]) == {16384, 131072}
    held = frame.held_filters(chosen[chosen["M"] == 16384], M=[16384, 131072], recipe=["bf16"], card="x")
    assert held == {"M": [16384], "recipe": ["bf16"], "card": "x"}
