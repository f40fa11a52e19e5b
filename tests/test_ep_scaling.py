"""EP-degree scaling (``table --kind ep-scaling``, ``plot`` of several EP runs) on the committed H100 runs.

Expectations are recomputed from the JSON files directly (plain json + statistics, not the harness's loaders): the
step is the median of its samples, the all-to-all share is the all-to-all stages' medians over all timed stages' of
the strategy (routing calls, which carry a note, left out), the rate is their bytes over their time.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner
from mxkernels.core.errors import InputError

from mxbench.cli import cli
from mxbench.workloads.ep.scaling import scaling_rows
from mxbench.storage.results import load_run

EP = Path(__file__).resolve().parent.parent / "results" / "nvidia-h100-80gb-hbm3" / "ep"
DSV3 = [EP / "ep-deepseek-v3.json", EP / "ep4-deepseek-v3.json"]


def expected(path: Path, strategy: str) -> tuple[float, float, float]:
    """(step us, all-to-all share %, all-to-all GB/s) of one strategy, from the raw JSON."""
    records = [r for r in json.loads(path.read_text())["records"] if r["point"]["recipe"] == strategy and not r["error"]]
    step = next(r for r in records if r["category"] == "end_to_end")
    stages = [r for r in records if r["category"] != "end_to_end" and not r["telemetry"].get("note")]
    slowest = [max(rank["median_us"] for rank in r["telemetry"]["ranks"]) for r in stages]
    a2a = [(r, us) for r, us in zip(stages, slowest, strict=True) if r["category"] == "all_to_all"]
    a2a_us = sum(us for _, us in a2a)
    moved = sum(r["bytes_read"] + r["bytes_written"] for r, _ in a2a)
    return statistics.median(step["samples_us"]), 100 * a2a_us / sum(slowest), moved / a2a_us / 1e3


def test_rows_follow_ep_degree_and_match_the_stored_records():
    rows = scaling_rows([load_run(p) for p in reversed(DSV3)])  # given out of order
    assert [(r["EP degree"], r["Strategy"]) for r in rows] == [
        (str(w), s) for w in (2, 4) for s in ("bf16", "mxfp8", "mxfp8_a2a")
    ]
    for row in rows:
        path = DSV3[0] if row["EP degree"] == "2" else DSV3[1]
        step_us, share, gbps = expected(path, row["Strategy"])
        assert float(row["Step fwd+bwd (us)"]) == pytest.approx(step_us, abs=0.05)
        assert row["All-to-all share of stage sum"] == f"{share:.0f}%"
        assert float(row["All-to-all GB/s (both dirs)"]) == pytest.approx(gbps, abs=0.5)
    bf16 = [r for r in rows if r["Strategy"] == "bf16"]
    # balanced routing sends (W-1)/W of the tokens away: the all-to-all share grows from EP=2 to EP=4
    assert int(bf16[1]["All-to-all share of stage sum"][:-1]) > int(bf16[0]["All-to-all share of stage sum"][:-1])


def test_runs_of_different_layers_or_the_same_degree_twice_are_refused():
    with pytest.raises(InputError, match="one layer on one card.*K=8192 N=5120"):
        scaling_rows([load_run(DSV3[0]), load_run(EP / "ep-llama4.json")])
    with pytest.raises(InputError, match="two runs at EP degree 2 with balanced routing"):
        scaling_rows([load_run(DSV3[0]), load_run(DSV3[0])])
    roofline = EP.parent / "roofline-deepseek-v3.json"
    with pytest.raises(InputError, match="reads runs of `mxbench ep`"):
        scaling_rows([load_run(DSV3[0]), load_run(roofline)])


def test_cli_table_and_figure_of_several_ep_runs(tmp_path):
    runner = CliRunner()
    files = [str(p) for p in (*DSV3, EP / "ep-deepseek-v3-skewed.json", EP / "ep4-deepseek-v3-skewed.json")]
    result = runner.invoke(cli, ["table", *files, "--kind", "ep-scaling", "--format", "csv"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("EP degree,Routing,Strategy,Step fwd+bwd (us)") and len(lines) == 1 + 4 * 3
    result = runner.invoke(cli, ["plot", *files, "--out", str(tmp_path / "scaling.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(cli, ["plot", files[0], str(EP.parent / "roofline-deepseek-v3.json"), "--out",
                                 str(tmp_path / "x.png")])  # fmt: skip
    assert result.exit_code == 2 and "reads runs of `mxbench ep`" in result.output
