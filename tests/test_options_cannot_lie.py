"""Options that cannot lie (issue 34, item 2): every float option finite and in its range, every list option
non-empty, huge integers refused with one line, a filter that selects nothing an exit 2 naming what the files hold,
and `ep --check` of no strategy refused. The rules live in the shared option types (``clikit.common``), so the last
test walks every command's options: a command added later inherits them."""

from __future__ import annotations

import math

import click
import pytest
from click.testing import CliRunner

from mxbench.cli import cli
from mxbench.storage.results import save_run

EP_RUN = "results/nvidia-h100-80gb-hbm3/ep/ep-deepseek-v3.json"
TINY_EP = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]


def one_line_exit_2(args, wanted: str = "") -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 2, (args, result.exit_code, result.output[-1500:])
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.output
    text = " ".join(result.output.split())
    assert wanted in text, (wanted, text)
    return text


@pytest.fixture
def runs(tmp_path):
    """Two runs of the same card, the second 1.5x slower: a gate that passes them lies."""
    from test_cli import synthetic_run

    base, slow = tmp_path / "base.json", tmp_path / "slow.json"
    save_run(synthetic_run(), base)
    save_run(synthetic_run(slow=1.5, seed=7), slow)
    return base, slow


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-nan", "NaN", "infinity"])
def test_compare_floor_that_is_not_a_finite_number_is_refused(runs, value):
    base, slow = runs
    one_line_exit_2(["compare", base, slow, "--floor-us", value], "'--floor-us'")
    one_line_exit_2(["compare", base, slow, f"--floor-us={value}"], "finite")


def test_compare_still_fails_a_slower_run_at_a_finite_floor(runs):
    base, slow = runs
    result = CliRunner().invoke(cli, ["compare", str(base), str(slow), "--floor-us", "0"])
    assert result.exit_code == 1 and "SLOWER" in result.output, result.output


@pytest.mark.parametrize("option", ["--intra-gbps", "--inter-gbps", "--latency-us"])
@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_ep_project_rates_and_latency_are_finite(option, value):
    one_line_exit_2(["ep-project", EP_RUN, option, value], f"'{option}'")


def test_check_timeout_is_finite():
    one_line_exit_2(["check", "--timeout", "nan"], "'--timeout'")
    one_line_exit_2(["check", "--timeout", "inf"], "'--timeout'")


@pytest.mark.parametrize("value", ["", ",,", " , ", ","])
@pytest.mark.parametrize("option", ["--M", "--pass", "--recipe", "--columns"])
def test_table_list_filters_are_never_empty(runs, option, value):
    one_line_exit_2(["table", runs[0], option, value], "at least one value")


def test_ep_check_of_no_strategy_is_refused(monkeypatch):
    from mxbench.workloads.ep import worker

    monkeypatch.setattr(worker, "run_worker", lambda *a, **k: pytest.fail("a check of nothing ran"))
    one_line_exit_2(["ep", "--check", *TINY_EP, "--strategy", ""], "'--strategy'")
    one_line_exit_2(["ep", "--check", *TINY_EP, "--strategy", ",,"], "at least one value")


@pytest.mark.parametrize("value", ["", ",,"])
def test_ep_project_of_no_degree_is_refused(value):
    one_line_exit_2(["ep-project", EP_RUN, "--ep", value], "'--ep'")


@pytest.mark.parametrize("value", [str(2**63), str(2**62), str(2**40), "9" * 5000])
def test_ep_project_huge_degrees_are_refused_with_one_line(value):
    one_line_exit_2(["ep-project", EP_RUN, "--ep", value], "--ep")


@pytest.mark.parametrize("args", [
    ["roofline", "--K", "256", "--N", "128", "--breakdown-M", str(2**64)],
    ["ep-project", EP_RUN, "--gpus-per-node", str(2**63)],
    ["ep-project", EP_RUN, "--top-k", str(2**70)],
    ["regress", "--baseline", EP_RUN, "--rounds", str(2**63)],
])  # fmt: skip
def test_integers_past_int64_are_refused_with_one_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(args)


@pytest.mark.parametrize("args, wanted", [
    (["--card", "nope"], "no records with card=nope"),
    (["--M", "12345"], "no records with M=12345"),
    (["--recipe", "nope"], "no records with recipe=nope"),
])  # fmt: skip
def test_a_filter_that_selects_nothing_names_what_the_files_hold(runs, args, wanted):
    text = one_line_exit_2(["table", runs[0], *args], wanted)
    assert "holds" in text or " in " in text


def test_an_empty_filter_is_refused_by_select_too(runs):
    """The library's filter (``mxbench.load`` then ``select``) refuses an empty list rather than selecting nothing."""
    from mxkernels.core.errors import InputError

    import mxbench
    from mxbench.views.frame import select

    df = mxbench.load(runs[0])
    for filters in ({"M": []}, {"passes": []}, {"recipe": ()}):
        with pytest.raises(InputError, match="selects nothing"):
            select(df, **filters)
    assert len(select(df, M=[1024])) == len(df)


def _every_option():
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):
                yield name, param


def test_every_float_option_of_every_command_refuses_nan_and_inf():
    """The group hardens every command's options when it is added: a float option of a new command (``map``, an EP
    strategy's) is finite without a word in that command."""
    seen = 0
    for name, param in _every_option():
        if isinstance(param.type, click.types.FloatParamType):
            for bad in ("nan", "inf", "1e400"):
                with pytest.raises(click.BadParameter):
                    param.type.convert(bad, param, None)
            seen += 1
    assert seen >= 5  # --floor-us (compare, regress), --intra-gbps, --inter-gbps, --latency-us, --timeout


def test_every_integer_option_refuses_a_huge_one():
    seen = 0
    for name, param in _every_option():
        if isinstance(param.type, click.types.IntParamType):
            for bad in (str(2**63), "9" * 5000):
                with pytest.raises(click.BadParameter):
                    param.type.convert(bad, param, None)
            seen += 1
    assert seen >= 20


def test_every_list_option_refuses_empty_and_non_finite_items():
    from mxbench.clikit.common import CommaList

    seen = 0
    for name, param in _every_option():
        if isinstance(param.type, CommaList):
            for bad in ("", ",,", " "):
                with pytest.raises(click.BadParameter):
                    param.type.convert(bad, param, None)
            if param.type.item is float:
                for bad in ("nan", "1,inf", "1e400"):
                    with pytest.raises(click.BadParameter):
                        param.type.convert(bad, param, None)
            seen += 1
    assert seen >= 10


def test_a_finite_float_still_converts():
    for name, param in _every_option():
        if isinstance(param.type, click.types.FloatParamType):
            lo = param.type.min if getattr(param.type, "min", None) is not None else 0.0
            value = param.type.convert(str(lo + 1.0), param, None)
            assert math.isfinite(value)


LAYER_RUN = "results/nvidia-h100-80gb-hbm3/layer-qwen3-30b-a3b.json"


@pytest.mark.parametrize("run, kind", [(EP_RUN, "ep"), (LAYER_RUN, "layer"), (LAYER_RUN, "layer-stages")])
@pytest.mark.parametrize("args, wanted", [
    (["--M", "5"], "no records with M=5"),
    (["--recipe", "nope"], "no records with recipe=nope"),
    (["--card", "nope"], "no records with card=nope"),
])  # fmt: skip
def test_every_table_kind_refuses_a_filter_that_selects_nothing(run, kind, args, wanted):
    one_line_exit_2(["table", run, "--kind", kind, *args], wanted)
