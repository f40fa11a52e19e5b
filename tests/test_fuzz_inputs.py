"""Property tests (Hypothesis) of hostile input: stored runs mutated (types, ranges, missing and extra fields, nesting,
huge integers, NaN and infinities, dates that are not dates) fed to the commands that read them, and numeric options
at their edges fed to the commands that take them. Whatever the input: the exit code is 0 or 2 (or compare's verdict
1), nothing raises out of the command (no traceback), and no input file changes. Derandomized and bounded, so CI runs the same cases in a
few tens of seconds; the checkers' verdicts must also agree with an independent JSON Schema validator."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mxkernels.core.errors import InputError

import mxbench
from mxbench.cli import cli
from mxbench.storage.validation import Published, parse, schema_file, valid

REPO = Path(__file__).resolve().parent.parent
SCALE = int(os.environ.get("MXBENCH_FUZZ_SCALE", "1"))
"""More cases, drawn at random, for a hunt by hand (MXBENCH_FUZZ_SCALE=20); CI runs the same bounded cases."""
SETTINGS = settings(max_examples=60 * SCALE, deadline=None, derandomize=SCALE == 1, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
RUNS = {
    "v2": "results/nvidia-h100-80gb-hbm3/roofline-deepseek-v3.json",
    "v1": "results/nvidia-h200/roofline-deepseek-v3.json",
    "peers": "results/nvidia-h200/peers-deepseek-v3.json",
    "layer": "results/nvidia-h100-80gb-hbm3/layer-qwen3-30b-a3b.json",
    "ep": "results/nvidia-h100-80gb-hbm3/ep/ep-deepseek-v3.json",
}
HOSTILE = [
    "fast", "", "not a date", "x" * 5000, -1, 0, 1.5, 2**31, 2**63, 10**20, 10**400, float("nan"), float("inf"),
    -float("inf"), True, False, None, [], {}, [[[[[[[[[[[]]]]]]]]]]], {"a": {"b": [1, "2", None]}},
    "9999-12-31T23:59:59+00:00", "0001-01-01T00:00:00Z", "2026-02-30T00:00:00+00:00", "2026-01-01 00:00:00+00:00",
    "forward", "gemm", "bf16", "mxfp8", "(1, 2) @ (3, 4, 5)", 131072, 7168, 2**20 + 1, 2**31 - 1, -1e-300, 1e300,
]  # fmt: skip


def trimmed(path: str) -> dict:
    """A stored run (under the repository, or anywhere) cut to its first point (every stage of it), so each case
    reads a small file."""
    payload = json.loads((REPO / path).read_text())  # an absolute path stays itself
    first = payload["records"][0]["point"]
    payload["records"] = [r for r in payload["records"] if r["point"] == first][:40]
    return payload


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, dict]:
    out = {name: trimmed(path) for name, path in RUNS.items()}
    model = tmp_path_factory.mktemp("model") / "model.json"  # what a CPU machine makes
    result = CliRunner().invoke(cli, ["roofline", "--K", "7168", "--N", "2048", "--M", "16384", "--out", str(model)])
    assert result.exit_code == 0, result.output
    out["model"] = json.loads(model.read_text())
    layer = model.with_name("layer-model.json")
    result = CliRunner().invoke(cli, ["layer", "--preset", "qwen3-30b-a3b", "--tokens", "4096", "--out", str(layer)])
    assert result.exit_code == 0, result.output
    out["layer-model"] = trimmed(str(layer))
    return out


def paths(node, prefix=()):
    """Every (path to a value) in a JSON tree, containers included."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from paths(child, (*prefix, key))


def hostile(draw):
    """One of ``HOSTILE``, a copy: an edit of the mutated file must not change the list (Hypothesis replays it)."""
    return copy.deepcopy(draw(st.sampled_from(HOSTILE)))


class Text(str):
    """A mutated file's text, shown by its length and start (Hypothesis prints a failing case; a run is ~100 kB)."""

    def __repr__(self) -> str:
        return f"<{len(self)} chars: {str.__repr__(self[:400])}...>"


@st.composite
def mutated(draw, bases: dict[str, dict]) -> tuple[str, str]:
    """(the base's name, the text of a mutated copy): one to three edits of a stored run, and sometimes a textual
    one JSON cannot express as a value (a 5000-digit integer, nesting past the recursion limit)."""
    name = draw(st.sampled_from(sorted(bases)))
    payload = copy.deepcopy(bases[name])
    for _ in range(draw(st.integers(1, 3))):
        where = list(paths(payload))
        path = where[draw(st.integers(0, len(where) - 1))]
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap", "empty"]))
        if not path:  # the whole file
            payload = hostile(draw)
            break
        key = path[-1]
        if op == "replace":
            parent[key] = hostile(draw)
        elif op == "delete":
            parent.pop(key)
        elif op == "add" and isinstance(parent[key], dict):
            parent[key][draw(st.sampled_from(["extra", "M", "date", "samples_us", "telemetry"]))] = hostile(draw)
        elif op == "wrap":
            parent[key] = [[[parent[key]]]] if draw(st.booleans()) else {"x": parent[key]}
        elif op == "empty" and isinstance(parent[key], (list, dict, str)):
            parent[key] = type(parent[key])()
    text = Text(json.dumps(payload))
    textual = draw(st.sampled_from([None] * 8 + ["digits", "deep"]))
    if textual == "digits":
        text = Text(text.replace("16384", "9" * 5000, 1))
    elif textual == "deep":
        text = Text(text.replace("7168", "[" * 100_000 + "]" * 100_000, 1))
    return name, text


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def invoke(args) -> None:
    """The command exits 0 or 2 (compare also 1: its verdict on a stage the mutation made SLOWER or broke) and
    raises nothing out of itself."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    codes = (0, 1, 2) if args[0] == "compare" else (0, 2)
    assert result.exit_code in codes, (args, result.exit_code, result.output[-2000:])
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in result.output, (args, result.output[-2000:])


def commands(name: str, bad: Path, good: Path, tmp: Path) -> list[list]:
    table = {"peers": ["--kind", "peers"], "layer": ["--kind", "layer"], "layer-model": ["--kind", "layer-stages"],
             "ep": ["--kind", "ep"]}.get(name, [])
    out = [["table", bad, *table], ["compare", good, bad], ["compare", bad, bad], ["history", bad, good]]
    if name in ("v2", "model"):
        out += [["table", bad, "--kind", "power"], ["table", bad, "--kind", "sweep", "--denominator", "measured"]]
    return out


def test_mutated_runs_exit_0_or_2_and_stay_as_they_were(bases, tmp_path):
    counts = {"cases": 0, "refused on load": 0}

    @SETTINGS
    @given(case=mutated(bases))
    def check(case):
        name, text = case
        bad, good = tmp_path / "bad.json", tmp_path / "good.json"
        bad.write_text(text)
        good.write_text(json.dumps(bases[name]))
        before = digest(bad), digest(good)
        try:
            mxbench.load(bad)
        except InputError:
            counts["refused on load"] += 1
        for args in commands(name, bad, good, tmp_path):
            invoke(args)
        assert (digest(bad), digest(good)) == before
        counts["cases"] += 1

    check()
    print(f"mutated runs: {counts}")
    assert counts["cases"] == SETTINGS.max_examples and 0 < counts["refused on load"] < counts["cases"]


def test_a_mutated_run_plots_or_is_refused(bases, tmp_path):
    """Figures are slow to draw: fewer cases, the model run and a measured one."""

    @settings(SETTINGS, max_examples=4 * SCALE)
    @given(case=mutated({k: bases[k] for k in ("v2", "model")}))
    def check(case):
        bad = tmp_path / "bad.json"
        bad.write_text(case[1])
        before = digest(bad)
        invoke(["plot", bad, "--out", tmp_path / "figures"])
        assert digest(bad) == before

    check()


def test_our_checker_agrees_with_jsonschema(bases):
    """On every mutated run that parses: the published schema accepts it under jsonschema exactly when ours does."""
    from test_schema_published import independent_validator

    other = independent_validator()(Published.RUN)
    seen = {True: 0, False: 0}

    @settings(SETTINGS, max_examples=300 * SCALE)
    @given(case=mutated(bases))
    def check(case):
        try:
            payload = parse(case[1])
        except InputError:
            return  # not JSON mxbench reads: refused before any schema
        ours = valid(payload, schema_file(Published.RUN))
        assert ours == other.is_valid(payload), case
        seen[ours] += 1

    check()
    assert seen[True] and seen[False]


# ------------------------------------------------------------------------------------------ numeric options

NUMBER_EDGES = ["9" * 5000, "-" + "9" * 5000, "nan", "inf", "-inf", "1e400", "", ",,", str(2**63)]
"""What every number option is fed, each with each option (``test_every_number_option_...``): a 5000-digit integer
(past Python's 4300-digit conversion limit), the non-finite floats, empty lists, past int64."""
EDGES = ["0", "-1", "1", str(2**31), str(2**63), str(2**64), "1e400", "nan", "inf", "-inf", "1.5", "", " ", "x" * 10000,
         "99999999999999999999", "0x10", "1,1,1", "1,", "-0", *NUMBER_EDGES]  # fmt: skip
OPTIONS = {
    # roofline on a CPU is the analytic model: fast, and what a new user runs first
    "roofline": (["--K", "7168", "--N", "2048", "--M", "16384"],
                 ["--M", "--N", "--K", "--G", "--seed", "--breakdown-M", "--samples", "--power-limit-watts"]),
    # ep without --check refuses a machine without GPUs after its arguments are checked: no worker starts
    "ep": (["--K", "7168", "--N", "2048"], ["--K", "--N", "--experts", "--tokens", "--top-k", "--seed", "--samples"]),
    # check's sizes: every edge but the skipped ones is refused before any kernel runs
    "check": (["--K", "64", "--N", "64", "--M", "64"], ["--K", "--N", "--M", "--G"]),
}


def test_numeric_options_at_their_edges_exit_0_or_2(tmp_path):
    ran = []

    @settings(SETTINGS, max_examples=80 * SCALE)
    @given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
    def check(command, data):
        base, options = OPTIONS[command]
        option = data.draw(st.sampled_from(options))
        value = data.draw(st.sampled_from(EDGES))
        if command == "check" and value == "1":
            return  # a valid size: check would run its kernels under the interpreter for a minute
        args = [a for a in base if a != option]
        if option in base:  # replace the base's value of the option
            args = base[: base.index(option)] + base[base.index(option) + 2:]
        out = ["--out", tmp_path / "run.json"] if command == "roofline" else []
        invoke([command, *args, option, value, *out])
        ran.append((command, option, value))

    check()
    print(f"numeric options: {len(ran)} cases")
    assert len({c for c, *_ in ran}) == len(OPTIONS)


RUN_FILE = REPO / RUNS["v2"]
EP_FILE = REPO / RUNS["ep"]
NUMBER_OPTIONS = {
    **OPTIONS,
    "compare": ([str(RUN_FILE), str(RUN_FILE)], ["--floor-us"]),
    "ep-project": ([str(EP_FILE)], ["--ep", "--gpus-per-node", "--intra-gbps", "--inter-gbps", "--latency-us",
                                    "--top-k", "--max-nodes-per-token"]),
    "table": ([str(RUN_FILE)], ["--M", "--pass", "--recipe", "--columns"]),
    "history": ([str(RUN_FILE)], ["--M", "--pass", "--recipe"]),
    "layer": (["--K", "64", "--N", "64"], ["--K", "--N", "--tokens", "--experts", "--top-k", "--seed", "--samples",
                                          "--recipe"]),
}  # fmt: skip
"""Every number (and list) option of the commands that read or model without a GPU, with the arguments it needs."""


def test_every_number_option_takes_every_edge_with_exit_2_and_no_traceback(tmp_path):
    """Each option of ``NUMBER_OPTIONS`` with each of ``NUMBER_EDGES``, every pair (not drawn: a fault in parsing
    one kind of number shows whichever option it is in). None of these values is valid (each is refused, exit 2)
    but 2**63 where a float option takes it (a finite floor or rate: compare may then give its verdict)."""
    cases = 0
    for command, (base, options) in sorted(NUMBER_OPTIONS.items()):
        for option in options:
            args = list(base)
            if option in args:
                i = args.index(option)
                args = args[:i] + args[i + 2:]
            out = ["--out", tmp_path / "run.json"] if command in ("roofline", "layer") else []
            for value in NUMBER_EDGES:
                result = CliRunner().invoke(cli, [str(a) for a in [command, *args, option, value, *out]])
                codes = (0, 1, 2) if value == str(2**63) else (2,)
                assert result.exit_code in codes, (command, option, value[:20], result.exit_code,
                                                   result.output[-800:])  # fmt: skip
                assert result.exception is None or isinstance(result.exception, SystemExit), (
                    command, option, value[:20], repr(result.exception))  # fmt: skip
                assert "Traceback" not in result.output
                (tmp_path / "run.json").unlink(missing_ok=True)
                cases += 1
    print(f"number options x edges: {cases} cases")
    assert cases >= 40 * len(NUMBER_EDGES)
