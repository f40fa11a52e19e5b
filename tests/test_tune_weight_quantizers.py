"""scripts/tune_weight_quantizers.py without a GPU: its byte counts, the shape classes it reports against
``fp8_hold``'s defaults tables, the candidates each case gets, and the launch it says to ship per class."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import tune_weight_quantizers as T  # a script, from the scripts folder


def test_minimal_bytes_are_three_an_element_and_the_scales():
    qwen_w2 = T.Case("w", "along_n", (128, 2048, 768))
    assert qwen_w2.span == 2048 and qwen_w2.min_bytes == 3 * 128 * 2048 * 768 + 4 * 128 * 768
    groups = T.Case("k", "k_groups", (65536, 768), 128)
    assert groups.span == 512 and groups.min_bytes == 3 * 65536 * 768 + 4 * 128 * 768


def test_cases_fall_in_the_tables_classes():
    classes = {c.name: T.shape_class(c) for c in T.CASES}
    assert classes["qwen3-30b-a3b w13 along N"] == 2048 and classes["gpt-oss-120b w2 along N"] == 4096
    assert classes["deepseek-v3 w2 along N"] == 1 << 31
    assert classes["gpt-oss-120b k_groups 131072x2880"] == 1024 and classes["qwen3-30b-a3b k_groups 65536x768"] == 512


def test_each_case_gets_the_default_first_and_holds_sized_for_its_span():
    for case in T.CASES:
        configs = T.candidates(case, quick=False)
        assert configs[0] is None and None not in configs[1:]
        assert T.default_config(case) not in configs[1:], case.name  # the default is timed once
        for c in configs:
            if isinstance(c, H.HoldConfig):
                assert c.hold_rows == max(16, 1 << (case.span - 1).bit_length()), (case.name, c)
        quick = T.candidates(case, quick=True)
        assert quick[0] is None and len(quick) <= 5 and set(map(repr, quick)) <= set(map(repr, configs))


def _row(case, config, us, ok=True, kind="k_groups", bound=1024):
    return {"case": case, "kind": kind, "class": bound, "config": config, "config_repr": f"<{config}>", "ok": ok,
            "us": us}  # fmt: skip


def test_ship_picks_the_least_total_time_over_the_class_among_launches_right_everywhere():
    rows = [_row("a", "default", 100), _row("b", "default", 200),
            _row("a", "fast", 50), _row("b", "fast", 100),
            _row("a", "faster but wrong on b", 10), _row("b", "faster but wrong on b", 0, ok=False),
            _row("a", "only a", 1),  # not timed on b (budget): not a pick
            _row("c", "default", 30, kind="along_n", bound=2048), _row("c", "slower", 31, kind="along_n", bound=2048)]  # fmt: skip
    picks = {(p["kind"], p["class"]): p for p in T.ship(rows)}
    assert picks[("k_groups", 1024)]["ship"] == "fast" and picks[("k_groups", 1024)]["speedup"] == pytest.approx(2.0)
    assert picks[("k_groups", 1024)]["config_repr"] == "<fast>" and picks[("k_groups", 1024)]["cases"] == ["a", "b"]
    assert picks[("along_n", 2048)]["ship"] == "default"


def test_labels_name_each_kernel_and_its_options():
    assert T.label(None) == "default"
    assert (
        T.label(H.HoldConfig(64, 512, num_warps=8, packed=True, prefetch=True)) == "hold 64x512 w8 2/SM packed prefetch"
    )
    assert T.label(C.WalkConfig(64, 128, 4, 4, prefetch=False, num_stages=3)) == "walk 64x128 w4 4/SM s3"
    assert T.label(C.WalkConfig(64, 64, 2, 8, max_registers=128)) == "walk 64x64 w2 8/SM prefetch r128"
    assert T.label(C.K_GROUPS_CONFIG) == "strips 64x512 step 128 g1024 split"


def test_the_script_runs_end_to_end_on_tiny_cases(monkeypatch, tmp_path, capsys):
    """main() on CPU under the interpreter with two tiny cases (time_fn and the session stubbed: no GPU): every
    candidate checked against the oracle and "timed", a candidate planted wrong reported WRONG and not timed, the
    ship block printed, and finish() given every row."""
    import argparse
    import types

    from mxkernels.quant import fp8_rowwise as F

    cases = (T.Case("tiny k_groups", "k_groups", (96, 40), 3), T.Case("tiny along N", "along_n", (2, 48, 40)))
    monkeypatch.setattr(T, "CASES", cases)
    monkeypatch.setattr(T, "DEVICE", "cpu")
    monkeypatch.setattr(
        T, "HOLDS", {32: [T._hold(16, 32, 2, 2, packed=True)], 64: [T._hold(8, 64, 2, 1, prefetch=True)]}
    )
    monkeypatch.setattr(T, "WALKS", [C.WalkConfig(16, 16, num_warps=2, programs_per_sm=2)])
    planted = C.WalkConfig(8, 16, num_warps=1)
    real_3d = F.quantize_fp8_rowwise_3d

    def wrong_for_planted(w, along="K", *, config=None):  # a launch whose output is off by one byte
        q, scale = real_3d(w, along, config=config)
        if config is planted:
            q.view(torch.uint8)[0, 0, 0] ^= 1
        return q, scale

    monkeypatch.setattr(F, "quantize_fp8_rowwise_3d", wrong_for_planted)
    monkeypatch.setattr(T, "WALKS", [*T.WALKS, planted])
    timed = []
    monkeypatch.setattr(
        T,
        "time_fn",
        lambda fn, **kw: timed.append(fn()) or types.SimpleNamespace(median_us=10.0 + len(timed), iqr_us=0.1),
    )
    finished = {}
    session = types.SimpleNamespace(
        args=argparse.Namespace(quick=False, cases="", budget_s=1e9, samples=1, out=str(tmp_path / "run.json"), mx=False),
        t0=0.0, device="CPU", roof=3.0, finish=lambda script, rows, skipped, summary, timing: finished.update(
            script=script, rows=rows, skipped=skipped, summary=summary))  # fmt: skip
    monkeypatch.setattr(T, "start", lambda *a, **k: session)
    monkeypatch.setattr(sys, "argv", ["tune_weight_quantizers.py"])
    assert T.main() == 0
    out = capsys.readouterr().out
    rows = finished["rows"]
    assert {r["case"] for r in rows} == {c.name for c in cases} and finished["script"] == "tune_weight_quantizers"
    wrong = [r for r in rows if not r["ok"]]
    assert [(r["case"], r["config"]) for r in wrong] == [("tiny along N", T.label(planted))]
    assert wrong[0]["error"].startswith("WRONG") and "us" not in wrong[0] and "WRONG" in out
    assert all(r["bits_equal_oracle"] and r["bits_equal_default"] for r in rows if r["ok"])
    assert len(timed) == len(rows) - 1 and "ship, per shape class" in out
    assert {(p["kind"], p["class"]) for p in finished["summary"]["ship"]} == {("k_groups", 512), ("along_n", 1024)}
    # --table reprints a stored run's table and picks without a GPU
    (tmp_path / "run.json").write_text(json.dumps({"rows": rows}))
    monkeypatch.setattr(sys, "argv", ["tune_weight_quantizers.py", "--table", str(tmp_path / "run.json")])
    assert T.main() == 0
    table = capsys.readouterr().out
    assert table.count("tiny along N") >= len([r for r in rows if r["case"] == "tiny along N"])
    assert "ship, per shape class" in table and "not ok: tiny along N" in table


def test_the_mx_sweep_runs_end_to_end_on_tiny_cases(monkeypatch, capsys):
    """--mx on CPU under the interpreter: MXFP8's blocked quantizers (3D along N, dim1 + K-groups) checked against
    the MX oracle with its blocked scale images, one class a kind."""
    import argparse
    import types

    from mxkernels.quant.quantize_cols import ColsConfig

    cases = (T.Case("mx tiny dim1", "mx_k_groups", (128, 64), 2), T.Case("mx tiny along N", "mx_along_n", (2, 64, 32)))
    monkeypatch.setattr(T, "MX_CASES", cases)
    monkeypatch.setattr(T, "DEVICE", "cpu")
    monkeypatch.setattr(T, "MX_COLS", [ColsConfig((32, 32), 1, 1, 0)])
    monkeypatch.setattr(T, "time_fn", lambda fn, **kw: fn() and types.SimpleNamespace(median_us=5.0, iqr_us=0.1))
    finished = {}
    args = argparse.Namespace(quick=False, cases="", budget_s=1e9, samples=1, out=None, mx=True)
    session = types.SimpleNamespace(args=args, t0=0.0, device="CPU", roof=3.0,
                                    finish=lambda script, rows, skipped, summary, timing: finished.update(rows=rows))  # fmt: skip
    monkeypatch.setattr(T, "start", lambda *a, **k: session)
    monkeypatch.setattr(sys, "argv", ["tune_weight_quantizers.py", "--mx"])
    assert T.main() == 0
    rows = finished["rows"]
    assert [(r["case"], r["config"], r["ok"]) for r in rows] == [
        ("mx tiny dim1", "default", True), ("mx tiny dim1", "cols 32x32 w1 s1 g0", True),
        ("mx tiny along N", "default", True), ("mx tiny along N", "cols 32x32 w1 s1 g0", True)]  # fmt: skip
    assert "quantize_blocked.DIM1_BLOCKED" in capsys.readouterr().out
    # dim1 + K-groups of (128, 64) in 2 groups: bf16 read, e4m3 written, the K-groups buffer (ceil_128(64) = 128 rows,
    # 128 / 32 + 4 x 2 = 12 scale columns; docs: shared/reference/mxfp8.md section 2).
    assert cases[0].min_bytes == 128 * 64 * 2 + 128 * 64 + 128 * 12


def test_an_interrupted_sweep_still_writes_what_it_measured(monkeypatch, capsys):
    """SIGINT (a session's deadline) in the middle: the launches measured are kept and written, the rest listed as
    skipped ("interrupted"), the table and picks printed."""
    import argparse
    import types

    cases = (T.Case("tiny k_groups", "k_groups", (96, 40), 3),)
    monkeypatch.setattr(T, "CASES", cases)
    monkeypatch.setattr(T, "DEVICE", "cpu")
    monkeypatch.setattr(T, "HOLDS", {32: [T._hold(16, 32, 2, 2)]})
    monkeypatch.setattr(T, "WALKS", [C.WalkConfig(16, 16, num_warps=2)])
    calls = []

    def time_fn(fn, **kw):
        calls.append(fn())
        if len(calls) == 2:
            raise KeyboardInterrupt
        return types.SimpleNamespace(median_us=7.0, iqr_us=0.1)

    monkeypatch.setattr(T, "time_fn", time_fn)
    finished = {}
    args = argparse.Namespace(quick=False, cases="", budget_s=1e9, samples=1, out=None, mx=False)
    session = types.SimpleNamespace(args=args, t0=0.0, device="CPU", roof=3.0,
                                    finish=lambda script, rows, skipped, summary, timing: finished.update(
                                        rows=rows, skipped=skipped))  # fmt: skip
    monkeypatch.setattr(T, "start", lambda *a, **k: session)
    monkeypatch.setattr(sys, "argv", ["tune_weight_quantizers.py"])
    try:
        assert T.main() == 0
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped the sweep: nothing written")
    configs = [T.label(c) for c in T.candidates(cases[0], quick=False)]
    assert [r["config"] for r in finished["rows"]] == configs[:1]
    assert [s["config"] for s in finished["skipped"]] == configs[1:]
    assert all(s["why"] == "interrupted" for s in finished["skipped"])
    assert "interrupted: 1 launches measured" in capsys.readouterr().out
