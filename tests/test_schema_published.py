"""The published JSON Schemas (mxbench/data/*.schema.json) are what a file is held to on load: every committed file
passes them under an independent validator (jsonschema, where installed), and each hostile file of issue 26 is
refused through the commands with exit 2, its name, the field and what was expected, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from mxkernels.core.errors import InputError

from mxbench.cli import cli
from mxbench.storage.validation import KEYWORDS, MAX_DEPTH, Published, schema_file, validate

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted(p for p in (REPO / "results").glob("**/*.json") if p.parent.name != "tuning")
V1_RUN = REPO / "results/nvidia-h200/roofline-deepseek-v3.json"
V2_RUN = REPO / "results/nvidia-h100-80gb-hbm3/roofline-deepseek-v3.json"


def kind_of(path: Path) -> Published:
    if path.name == "alltoall_ceilings.json":
        return Published.ALLTOALL_CEILINGS
    return Published.CEILINGS if path.name == "ceilings.json" else Published.RUN


def independent_validator():
    """A jsonschema validator of the published files, held to the rules each file states beyond JSON Schema
    (integers without a fraction part, finite numbers); None where jsonschema is not installed."""
    jsonschema = pytest.importorskip("jsonschema")
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    files = {f"{k.value}.schema.json": schema_file(k) for k in Published}
    registry = Registry().with_resources(
        (name, Resource.from_contents(c, default_specification=DRAFT202012)) for name, c in files.items()
    )
    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda _, v: (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v)),
    })  # fmt: skip
    strict = jsonschema.validators.extend(base, type_checker=checker)
    return lambda kind: strict(files[f"{kind.value}.schema.json"], registry=registry,
                               format_checker=base.FORMAT_CHECKER)  # fmt: skip


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO / "results")))
def test_every_committed_file_passes_the_published_schema(path):
    payload = json.loads(path.read_text())
    validate(payload, kind_of(path))  # ours
    errors = list(independent_validator()(kind_of(path)).iter_errors(payload))
    assert not errors, [e.message[:200] for e in errors[:3]]


def test_the_schema_files_use_only_the_keywords_the_validator_implements():
    def keys(node):
        if isinstance(node, dict):
            yield from node
            for k, v in node.items():
                if k not in ("properties", "$defs", "enum", "const"):
                    yield from keys(v)
                elif k in ("properties", "$defs"):
                    for sub in v.values():
                        yield from keys(sub)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)

    for kind in Published:
        assert set(keys(schema_file(kind))) <= KEYWORDS, kind


def test_the_published_bounds_are_the_kernels_bounds():
    from mxkernels.core.names import Category, Pass
    from mxkernels.core.runtime import MAX_GROUPS

    from mxbench.plan.points import MAX_DIM, MAX_TOKENS

    defs = schema_file(Published.RUN)["$defs"]
    point = defs["point"]["properties"]
    assert (point["M"]["maximum"], point["N"]["maximum"], point["K"]["maximum"]) == (MAX_TOKENS, MAX_DIM, MAX_DIM)
    assert point["G"]["maximum"] == MAX_GROUPS
    record = defs["record"]["properties"]
    assert record["pass_name"]["enum"] == [str(p) for p in Pass]
    assert record["category"]["enum"] == [str(c) for c in Category]


def test_what_the_writer_writes_passes_both_validators(tmp_path):
    result = CliRunner().invoke(cli, ["roofline", "--K", "7168", "--N", "2048", "--M", "16384", "--recipe",
                                      "bf16,mxfp8", "--out", str(tmp_path / "model.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "model.json").read_text())
    validate(payload, Published.RUN)
    assert not list(independent_validator()(Published.RUN).iter_errors(payload))


# ------------------------------------------------------------------------------------------ the files


def write(tmp_path, payload, name="bad.json") -> Path:
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def refused(args, *expected) -> str:
    """``args`` exit 2 with one line that holds each of ``expected``."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    line = result.output.strip()
    assert len(line.splitlines()) == 1 and all(e in line for e in expected), line
    return line


def v2() -> dict:
    return json.loads(V2_RUN.read_text())


def test_a_schema_1_record_whose_shape_is_no_shape(tmp_path):
    payload = json.loads(V1_RUN.read_text())
    payload["records"][3]["shape"] = "x"
    bad = write(tmp_path, payload)
    refused(["table", bad], str(bad), "records[3].shape must match", "got 'x'")


def test_an_integer_of_5000_digits(tmp_path):
    payload = v2()
    payload["records"][0]["point"]["M"] = "@M"
    bad = write(tmp_path, json.dumps(payload).replace('"@M"', "9" * 5000))
    refused(["table", bad], str(bad), "not an mxbench results file", "4300 digits")
    # one short enough to parse is out of range, by name; in a field mxbench keeps unread, too
    bad = write(tmp_path, json.dumps(payload).replace('"@M"', "9" * 400))
    refused(["table", bad], "records[0].point.M must be an integer >= 1 and <= 2**31-1, got 999")
    payload = v2()
    payload["meta"]["group_sizes"][0]["M"] = "@M"
    bad = write(tmp_path, json.dumps(payload).replace('"@M"', "9" * 400))
    refused(["table", bad], "meta['group_sizes'][0]['M'] must be a number >= -1e+30 and <= 1e+30, got 999")


@pytest.mark.parametrize("levels", [100_000, MAX_DEPTH + 1])
def test_nesting_past_the_recursion_limit_or_the_schema_depth(tmp_path, levels):
    payload = v2()
    payload["records"][0]["telemetry"]["deep"] = "@"
    bad = write(tmp_path, json.dumps(payload).replace('"@"', "[" * levels + "]" * levels))
    for args in (["table", bad], ["history", bad], ["compare", bad, bad], ["plot", bad, "--out", tmp_path / "f"]):
        refused(args, str(bad), f"nested deeper than the {MAX_DEPTH} levels")
    refused(["table", tmp_path], str(bad), "nested deeper")  # found in a folder, not named


def test_nesting_within_the_limit_loads(tmp_path):
    payload = v2()
    payload["records"][0]["telemetry"]["deep"] = "@"
    # the record sits 3 levels down (file, records, record) and its telemetry adds one
    fits = write(tmp_path, json.dumps(payload).replace('"@"', "[" * (MAX_DEPTH - 4) + "]" * (MAX_DEPTH - 4)))
    assert CliRunner().invoke(cli, ["table", str(fits)]).exit_code == 0


@pytest.mark.parametrize("command", [["table", "{bad}", "--kind", "sweep"], ["plot", "{bad}", "--out", "{tmp}/f"]])
def test_M_of_10_to_the_20(tmp_path, command):
    payload = v2()
    payload["records"][0]["point"]["M"] = 10**20
    bad = write(tmp_path, payload)
    refused([a.format(bad=bad, tmp=tmp_path) for a in command], str(bad),
            "records[0].point.M must be an integer >= 1 and <= 2**31-1, got 100000000000000000000")  # fmt: skip


def test_telemetry_that_is_no_number(tmp_path):
    payload = v2()
    payload["records"][5]["telemetry"]["sm_clock_mhz"] = "fast"
    bad = write(tmp_path, payload)
    refused(["table", bad, "--kind", "power"], str(bad), "records[5].telemetry.sm_clock_mhz must be a number >= 0",
            "got 'fast'")  # fmt: skip


def test_a_number_that_is_not_finite(tmp_path):
    payload = v2()
    payload["records"][2]["samples_us"][0] = float("nan")
    bad = write(tmp_path, payload)  # json writes NaN, which Python's json reads back
    refused(["table", bad], "records[2].samples_us[0] must be a number", "got nan")
    bad = write(tmp_path, json.dumps(v2()).replace('"bytes_read": ', '"bytes_read": 1e400, "x": ', 1))
    refused(["table", bad], "records[0].bytes_read must be an integer", "got inf")


def test_stored_ceilings_without_a_power_limit(tmp_path):
    payload = v2()
    assert payload["meta"]["ceilings"]["power_limit_w"] is not None
    del payload["meta"]["ceilings"]["power_limit_w"]
    bad = write(tmp_path, payload)
    refused(["table", bad, "--denominator", "measured"], str(bad), "meta.ceilings.power_limit_w is missing")


def test_a_ceilings_file_without_a_power_limit(tmp_path):
    from mxbench.instruments.ceiling_store import load_ceilings

    stored = json.loads((REPO / "results/nvidia-h200/ceilings.json").read_text())
    del stored["entries"][0]["power_limit_w"]
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    write(folder, stored, "ceilings.json")
    with pytest.raises(InputError, match=r"nvidia-h200/ceilings.json: entries\[0\].power_limit_w is missing"):
        load_ceilings(tmp_path, "NVIDIA H200")


def test_an_all_to_all_ceiling_with_no_rate(tmp_path):
    from mxbench.workloads.ep.ceiling import load_alltoall_ceiling

    stored = json.loads((REPO / "results/nvidia-h100-80gb-hbm3/alltoall_ceilings.json").read_text())
    stored["entries"][0]["bidirectional_gbps"] = 0
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    folder.mkdir()
    write(folder, stored, "alltoall_ceilings.json")
    with pytest.raises(InputError, match=r"entries\[0\].bidirectional_gbps must be a number > 0"):
        load_alltoall_ceiling(tmp_path, stored["card"], 2)


@pytest.mark.parametrize("date", ["not a date", "2026-13-01T00:00:00+00:00", "2026-01-01", "2026-01-01T00:00:00"])
def test_a_run_whose_date_is_not_a_date(tmp_path, date):
    payload = v2()
    payload["meta"]["date"] = date
    bad = write(tmp_path, payload)
    refused(["history", bad, V2_RUN], str(bad), "meta.date must be an ISO 8601 date and time", repr(date))


def test_a_commit_time_that_is_not_a_date(tmp_path):
    payload = v2()
    payload["meta"]["implementations"]["mxkernels"]["git_commit_time"] = "yesterday"
    bad = write(tmp_path, payload)
    refused(["history", bad], "meta.implementations['mxkernels'].git_commit_time must be an ISO 8601 date")


def test_a_file_with_no_records(tmp_path):
    """Decided: exit 2. A run with no records has nothing to show or compare, and a gate fed one must not pass."""
    payload = v2()
    payload["records"] = []
    bad = write(tmp_path, payload)
    for args in (["table", bad], ["compare", V2_RUN, bad], ["history", bad], ["plot", bad, "--out", tmp_path / "f"]):
        refused(args, str(bad), "records is empty: the file holds no records")


def test_check_refuses_M_past_int32_before_any_work():
    """Found by the fuzz test: `check --M 2147483648` allocated half a terabyte and crashed (exit 1)."""
    result = CliRunner().invoke(cli, ["check", "--K", "64", "--N", "64", "--M", str(2**31)])
    assert result.exit_code == 2 and "2147483648 is not in the range 1<=x<=2147483647" in result.output, result.output


def test_schema_true_is_not_schema_1(tmp_path):
    """Found by the fuzz test: Python's True == 1 let "schema": true through as schema 1 (jsonschema refuses it)."""
    payload = json.loads(V1_RUN.read_text())
    payload["schema"] = True
    refused(["table", write(tmp_path, payload)], "results schema True is not supported")
    assert not valid_under_ours({**v2(), "schema": True})
    assert not valid_under_ours({**v2(), "records": [{**v2()["records"][0], "measured": 1}]})


def valid_under_ours(payload) -> bool:
    from mxbench.storage.validation import valid

    return valid(payload, schema_file(Published.RUN))
