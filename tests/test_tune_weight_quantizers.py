"""scripts/tune_weight_quantizers.py without a GPU: its byte counts, the shape classes it reports against
``fp8_hold``'s defaults tables, the candidates each case gets, and the launch it says to ship per class."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import tune_weight_quantizers as T  # noqa: E402 -- a script, from the scripts folder


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
    assert T.label(H.HoldConfig(64, 512, num_warps=8, packed=True, prefetch=True)) == "hold 64x512 w8 2/SM packed prefetch"
    assert T.label(C.WalkConfig(64, 128, 4, 4, prefetch=False, num_stages=3)) == "walk 64x128 w4 4/SM s3"
    assert T.label(C.WalkConfig(64, 64, 2, 8, max_registers=128)) == "walk 64x64 w2 8/SM prefetch r128"
    assert T.label(C.K_GROUPS_CONFIG) == "strips 64x512 step 128 g1024 split"
