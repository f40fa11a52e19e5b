"""Tuning runs (``scripts/tune_*.py``) are stored with the metadata every measured run carries, under the published
``tuning.schema.json``; the committed ones, written before it, still load and still tabulate."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest
from helpers import FakeGPU
from mxkernels.core.errors import InputError

from mxbench.measuring.metadata import tuning_metadata
from mxbench.storage.validation import Published, validate

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import tuning  # noqa: E402 -- the scripts' shared module, from the scripts folder

COMMITTED = sorted((REPO / "results").glob("*/tuning/tune_*.json"))
NVML = {"driver_version": "999.1", "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "power_limit_w": 700.0}


def _instruments():
    ins = FakeGPU().instruments()
    return type(ins)(**{**ins.__dict__, "snapshot": lambda: dict(NVML)})


def _finished_run(tmp_path, timing=None) -> dict:
    meta = tuning_metadata(_instruments(), "python scripts/tune_x.py --samples 7", {**tuning.TIME_FN, "samples": 7})
    args = argparse.Namespace(out=str(tmp_path / "run.json"), budget_s=1.0)
    session = tuning.Session(args, time.monotonic(), "Fake GPU", 2.9, meta)
    rows = [{"backend": "triton_ws", "us": 5.0, "sqnr_vs_native_db": float("inf")}]
    session.finish("tune_x", rows, [], {"best": rows[0]}, timing=timing)
    return json.loads((tmp_path / "run.json").read_text())


def test_a_tuning_run_carries_the_card_clocks_limits_commit_and_timing(tmp_path):
    run = _finished_run(tmp_path, timing={"target_replay_ms": 5.0})
    validate(run, Published.TUNING)
    meta = run["meta"]
    assert (run["schema"], run["kind"], run["script"], run["device"]) == (1, "tuning", "tune_x", "Fake GPU")
    assert meta["card"] == "Fake GPU" and meta["driver"] == "999.1" and meta["device_properties"]["uuid"] == "GPU-fake"
    assert meta["nvml"]["sm_clock_mhz"] == 1980 and meta["nvml"]["power_limit_w"] == 700.0
    assert "git_commit" in meta and meta["torch"] and meta["triton"] and meta["implementations"]
    assert meta["command"] == "python scripts/tune_x.py --samples 7" and meta["finished"] >= meta["date"]
    assert meta["timing"] == {**tuning.TIME_FN, "samples": 7, "target_replay_ms": 5.0}
    assert run["rows"][0]["sqnr_vs_native_db"] == float("inf") and run["best"]["us"] == 5.0


@pytest.mark.parametrize("missing", ["driver", "nvml", "timing", "git_commit", "date"])
def test_a_schema_1_run_without_its_metadata_is_refused(tmp_path, missing):
    run = _finished_run(tmp_path)
    del run["meta"][missing]
    with pytest.raises(InputError, match=f"meta.{missing} is missing"):
        validate(run, Published.TUNING)
    run.pop("meta")
    with pytest.raises(InputError, match="meta is missing"):
        validate(run, Published.TUNING)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_committed_tuning_run_loads_under_the_schema(path):
    validate(json.loads(path.read_text()), Published.TUNING)


def test_the_gemm_table_reads_a_schema_1_run_as_it_reads_the_old_ones(tmp_path):
    import tune_fp8_gemm

    old = json.loads((REPO / "results/nvidia-h100-80gb-hbm3/tuning/tune_fp8_gemm-8.json").read_text())
    meta = tuning_metadata(_instruments(), "python scripts/tune_fp8_gemm.py", tuning.TIME_FN)
    new = tuning.tuning_run("tune_fp8_gemm", {**meta, "card": old["device"]}, old["rows"], [], {}, old["copy_tbps"])
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert tune_fp8_gemm.table([str(tmp_path / "new.json")]) == tune_fp8_gemm.table([str(tmp_path / "old.json")])
