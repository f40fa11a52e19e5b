"""Every results file is checked against its schema on load (schema 2, and schema 1 before it is migrated): a file
that is JSON but not a run is refused with its name and the field that is wrong, never a traceback."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import committed_results
from mxkernels.core.errors import InputError

from mxbench.cli import cli
from mxbench.storage.results import Point, Record, Run, load_run, run_to_json

REPO = Path(__file__).resolve().parent.parent
COMMITTED = [p for p in committed_results() if not p.name.endswith("ceilings.json") and p.parent.name != "tuning"]
# every stored run: the rooflines, peers, baselines, expert-parallel and sharded runs (not a user's own, made here)


CEILINGS = {"card": "NVIDIA H200", "power_limit_w": 700.0, "copy_tbps": 4.1, "read2write1_tbps": 4.2, "read_tbps": 4.3,
            "bandwidth_tbps": 4.3, "bf16_tflops": 700.0, "fp8_tflops": None}  # fmt: skip
"""A ceilings entry with every field ``ceiling_store.Ceilings`` requires."""


def valid_payload() -> dict:
    records = [
        Record(Point(1024, 2048, 7168, 8), "forward", "quantize_a", "quantize_dim0", "quantize", "Quantize A",
               ((1024, 7168),), bytes_read=10, bytes_written=5, samples_us=[10.0, 10.2, 9.9]),
        Record(Point(1024, 2048, 7168, 8, "bf16"), "forward", "gemm_fwd", "mm", "gemm", shapes=((1024, 7168),),
               flops=100, precision="bf16", measured=False, model_us=3.0),
    ]  # fmt: skip
    meta = {"card": "NVIDIA H200", "measured": True, "timing": {"cold_l2": True, "use_graph": True, "samples": 3},
            "implementations": {"mxkernels": {"module": "mxkernels", "distribution": "mxbench", "version": "0.1.0",
                                              "commit": "abc", "dirty": False}}}  # fmt: skip
    return json.loads(run_to_json(Run(meta, records)))


def load(tmp_path, payload, name="run.json"):
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return load_run(path), path


def refused(tmp_path, payload) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(InputError) as e:
        load_run(path)
    return str(e.value)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO / "results")))
def test_every_committed_run_is_valid(path):
    run = load_run(path)
    assert run.records and all(r.shapes for r in run.records)


def test_a_valid_run_round_trips(tmp_path):
    run, _ = load(tmp_path, valid_payload())
    assert [r.stage for r in run.records] == ["quantize_a", "gemm_fwd"] and run.records[1].model_us == 3.0


@pytest.mark.parametrize(
    "mutate, field, wanted",
    [
        (lambda d: d["records"][0]["point"].update(M="abc"), "records[0].point.M", "must be an integer >= 1 and <= 2**31-1, got 'abc'"),
        (lambda d: d["records"][0]["point"].update(M=True), "records[0].point.M", "must be an integer >= 1 and <= 2**31-1, got True"),
        (lambda d: d["records"][0]["point"].update(M=0), "records[0].point.M", "must be an integer >= 1"),
        (lambda d: d["records"][0]["samples_us"].insert(1, "fast"), "records[0].samples_us[1]", "a number >= -1e+12 and <= 1e+12"),
        (lambda d: d["records"][0].update(samples_us=[-1.0, -2.0, 3.0]), "records[0].samples_us", "positive median"),
        (lambda d: d["records"][0].update(samples_us="10"), "records[0].samples_us", "must be a list"),
        (lambda d: d["records"][1].update(model_us=-3), "records[1].model_us", "a number >= 0 and <= 1e+12, got -3"),
        (lambda d: d["records"][0].update(shapes=[[1024, "K"]]), "records[0].shapes[0][1]", "must be an integer"),
        (lambda d: d["records"][0].update(shapes="(1024, 7168)"), "records[0].shapes", "must be a list"),
        (lambda d: d["records"][0].update(measured="yes"), "records[0].measured", "true or false"),
        (lambda d: d["records"][0].update(bytes_read=1.5), "records[0].bytes_read", "an integer"),
        (lambda d: d["records"][0].update(telemetry=[]), "records[0].telemetry", "an object"),
        (lambda d: d["records"][0].update(error=5), "records[0].error", "a string or null"),
        (lambda d: d["records"][0].pop("stage"), "records[0].stage", "is missing"),
        (lambda d: d["records"][0].update(pass_name="fwd"), "records[0].pass_name",
         "one of forward, backward_input, backward_weight, end_to_end, got 'fwd'"),
        (lambda d: d["records"][0].update(category="copy"), "records[0].category", "one of quantize, rearrange"),
        (lambda d: d["records"][0]["point"].update(tokens=5), "records[0].point", "unknown fields ['tokens']"),
        (lambda d: d["records"].__setitem__(1, 7), "records[1]", "must be an object"),
        (lambda d: d.update(records={}), "records", "must be a list"),
        (lambda d: d["meta"].update(card=["H200"]), "meta.card", "must be a string"),
        (lambda d: d["meta"].update(measured="false"), "meta.measured", "true or false"),
        (lambda d: d["meta"]["timing"].update(samples="25"), "meta.timing.samples", "an integer"),
        (lambda d: d["meta"].update(ceilings={**CEILINGS, "bandwidth_tbps": "fast"}),
         "meta.ceilings.bandwidth_tbps", "a number > 0 and <= 1e+07"),
        (lambda d: d["meta"].update(ceilings={**CEILINGS, "copy_tbps": 0}), "meta.ceilings.copy_tbps", "a number > 0"),
        (lambda d: d["meta"].update(ceilings={k: v for k, v in CEILINGS.items() if k != "power_limit_w"}),
         "meta.ceilings.power_limit_w", "is missing"),
        (lambda d: d["meta"].update(ceilings={**CEILINGS, "sm90": 2}),
         "meta.ceilings", "unknown fields ['sm90']"),
        (lambda d: d["meta"]["implementations"]["mxkernels"].update(dirty="no"),
         "meta.implementations['mxkernels'].dirty", "true or false or null"),
        (lambda d: d.pop("meta"), "meta", "is missing"),
    ],
)  # fmt: skip
def test_a_bad_field_is_named_with_the_file(tmp_path, mutate, field, wanted):
    payload = valid_payload()
    mutate(payload)
    message = refused(tmp_path, payload)
    assert message.startswith(f"{tmp_path / 'bad.json'}: {field}") and wanted in message, message


@pytest.mark.parametrize("text, wanted", [
    ("[1, 2]", "a results file holds a JSON object, got list"),
    ('{"schema": 3, "meta": {}, "records": []}', "results schema 3 is not supported"),
    ("{not json", "not an mxbench results file"),
])  # fmt: skip
def test_files_that_are_not_runs(tmp_path, text, wanted):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(InputError, match=wanted):
        load_run(path)


def test_schema_1_is_checked_before_it_is_migrated(tmp_path):
    payload = json.loads((REPO / "results/nvidia-h200/roofline-deepseek-v3.json").read_text())
    assert payload["schema"] == 1
    payload["records"][2]["shape"] = [131072, 224]  # schema 1 stored the display string
    assert "records[2].shape must be a string, got [131072, 224]" in refused(tmp_path, payload)


def test_old_peers_runs_name_their_implementations_and_load_as_entries_of_unknown_code():
    run = load_run(REPO / "results/nvidia-h200/peers-deepseek-v3.json")
    assert set(run.meta["implementations"]) == {"mxkernels", "torchao", "torch.compile"}
    fields = {"module", "distribution", "version", "commit", "dirty", "git_commit_time"}
    assert all(set(e) == fields and not any(e.values())
               for e in run.meta["implementations"].values())  # fmt: skip


def test_the_ceilings_schema_is_the_ceilings_record():
    """The published entry names every field of ``Ceilings`` and requires those without a default (an entry without
    power_limit_w once crashed `table --denominator measured`)."""
    from mxbench.instruments.ceiling_store import Ceilings
    from mxbench.storage.validation import Published, schema_file

    entry = schema_file(Published.CEILINGS)["$defs"]["entry"]
    fields = dataclasses.fields(Ceilings)
    assert set(entry["properties"]) == {f.name for f in fields}
    no_default = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert set(entry["required"]) == no_default


def wrong_values():
    return ["abc", -1, 1.5, True, None, [], {}, float("nan")]


def test_no_wrong_value_anywhere_in_a_record_gives_a_traceback(tmp_path):
    """Every field of a record and of its point set to each wrong value in turn: the file is refused with an
    InputError, or it loads (the value is acceptable there) and the table and compare commands read it without a
    traceback."""
    base = valid_payload()
    base["meta"]["hardware"] = "h200"
    tried = loaded = 0
    for where in ("record", "point"):
        keys = base["records"][0] if where == "record" else base["records"][0]["point"]
        for key in list(keys):
            for value in wrong_values():
                payload = copy.deepcopy(base)
                target = payload["records"][0] if where == "record" else payload["records"][0]["point"]
                target[key] = value
                path = tmp_path / "fuzz.json"
                path.write_text(json.dumps(payload))
                tried += 1
                try:
                    load_run(path)
                except InputError:
                    continue
                loaded += 1
                for args in (["table", path, "--kind", "sweep"], ["compare", path, path]):
                    result = CliRunner().invoke(cli, [str(a) for a in args])
                    assert isinstance(result.exception, SystemExit | None), (key, value, result.output)
    assert tried == len(wrong_values()) * (len(base["records"][0]) + len(base["records"][0]["point"]))
    assert 0 < loaded < tried


@pytest.mark.parametrize("command", [["table", "{bad}"], ["compare", "{good}", "{bad}"], ["plot", "{bad}", "--out",
                                                                                           "{tmp}/figs"]])  # fmt: skip
def test_the_commands_name_the_file_and_field_and_exit_2(tmp_path, command):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(valid_payload()))
    payload = valid_payload()
    payload["records"][0]["point"]["M"] = "abc"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(payload))
    args = [a.format(bad=bad, good=good, tmp=tmp_path) for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Error: {bad}: records[0].point.M must be an integer >= 1 and <= 2**31-1, got 'abc'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
