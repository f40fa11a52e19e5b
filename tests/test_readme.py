"""The README and the docs it links to are checked like code: every rendered table (README.md's headline tables,
docs/results/<card>.md's full ones) is what the command above it prints, byte for byte; the Python example and the
notebook example run (the first on CPU tensors under Triton's interpreter); every CPU command runs as written; the CI
commands and the example workflow use only targets and options that exist; every relative link points at a file (and
heading) that exists."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from mxbench.cli import cli

from mxbench.clikit import common

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
WORKFLOW = REPO / ".github" / "workflows" / "gpu-regression.yml"
CHECKED = [REPO / "README.md", *sorted((DOCS / "results").glob("*.md")), DOCS / "plugins.md", DOCS / "ci.md",
           DOCS / "stored-files.md"]  # fmt: skip
"""The files whose tables and commands are run: the README and the docs its tables and checked blocks moved to."""
TEXTS = {path.relative_to(REPO).as_posix(): path.read_text() for path in CHECKED}
TABLE_BLOCKS = [(name, m) for name, text in TEXTS.items()
                for m in re.finditer(r"```bash\n(mxbench (?:table|ep-project) [^\n]*)\n```\n\n", text)]  # fmt: skip
TABLES_BEFORE_THE_MOVE = 29
"""The distinct table commands the README rendered when it held every table (issue 31): none may be lost."""


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else None]


@pytest.mark.parametrize("block", TABLE_BLOCKS, ids=lambda b: f"{b[0]}: {b[1].group(1)[:60]}")
def test_each_rendered_table_is_what_its_command_prints(block, monkeypatch):
    name, match = block
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(cli, shlex.split(match.group(1))[1:])
    assert result.exit_code == 0, result.output
    shown = TEXTS[name][match.end() : match.end() + len(result.output)]
    assert shown == result.output


def test_the_readme_and_the_results_pages_render_tables():
    commands = {m.group(1) for _, m in TABLE_BLOCKS}
    assert len(commands) >= TABLES_BEFORE_THE_MOVE  # every table the README rendered is still rendered somewhere
    per_file = {name: sum(1 for n, _ in TABLE_BLOCKS if n == name) for name in TEXTS}
    assert per_file["README.md"] >= 3  # a headline table per workload: the step, the layer, EP
    assert all(per_file[name] >= 1 for name in TEXTS if name.startswith("docs/results/"))
    shown = {m.group(1) for n, m in TABLE_BLOCKS if n == "README.md"}
    assert shown <= {m.group(1) for n, m in TABLE_BLOCKS if n.startswith("docs/results/")}  # each also in the full set


def test_the_python_example_runs_on_a_cpu(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", section("Python API"), flags=re.DOTALL)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the example sets it itself
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    backend_line, shapes_line = done.stdout.splitlines()
    assert backend_line.split()[1:] == ["torch.Size([256,", "64])"]
    assert shapes_line == "torch.Size([256, 64]) torch.Size([256, 128]) torch.Size([2, 64, 128])"


# -------------------------------------------------------------------------------------------- CI commands


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z-]+):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))


def _options(words: list[str]) -> list[str]:
    return [w.split("=")[0] for w in words if w.startswith("--")]


def check_command(line: str) -> None:
    """``mxbench CMD ...`` uses options CMD has; ``make [flags] TARGET [VAR=...]`` an existing target, and the
    options in REGRESS_FLAGS are options of ``mxbench regress``."""
    words = shlex.split(line.split("#")[0].split(">")[0].split("|")[0])
    if words[0] == "mxbench":
        command = cli.commands[words[1]]
        known = {o for p in command.params if isinstance(p, click.Option) for o in p.opts}
        assert set(_options(words[2:])) <= known, line
    elif words[0] == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        assert targets and set(targets) <= _make_targets(), line
        flags = [w.split("=", 1)[1] for w in words if w.startswith("REGRESS_FLAGS=")]
        regress = {o for p in cli.commands["regress"].params if isinstance(p, click.Option) for o in p.opts}
        assert all(set(_options(shlex.split(f))) <= regress for f in flags), line


def test_the_ci_section_commands_exist():
    text = section("Tracking kernel timings in CI")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL) for line in block.splitlines()]
    commands = [line for line in lines if line.split() and line.split()[0] in ("mxbench", "make")]
    assert len(commands) >= 4
    for line in commands:
        check_command(line)
    assert "gpu-regression.yml" in text and "example" in text


def test_the_example_workflow_is_labelled_an_example_and_gates_on_make_regress():
    text = WORKFLOW.read_text()
    assert text.startswith("# EXAMPLE, not run by this repository")
    job = yaml.safe_load(text)["jobs"]["regress"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    runs = [step.get("run", "") for step in job["steps"]]
    (regress,) = [r for r in runs if "make" in r and "regress" in r]
    check_command(regress.strip().splitlines()[-1])
    gate = next(s for s in job["steps"] if "regress" in s.get("run", "") and "make" in s.get("run", ""))
    assert gate.get("shell") == "bash" and "if" not in gate  # pipefail: the job fails with make regress
    summary = next(s for s in job["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    artifact = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert summary["if"] == "always()" and artifact["if"] == "always()" and artifact["with"]["path"] == "regress/"


def test_the_notebook_example_runs_as_written(tmp_path, monkeypatch):
    text = TEXTS["docs/stored-files.md"]
    section = text[text.index("## Results in Python") :]
    bash, python, output = re.search(r"```bash\n(.*?)\n```\n\n```python\n(.*?)```\n\n```\n(.*?)```", section,
                                     re.DOTALL).groups()  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").symlink_to(REPO / "results")
    monkeypatch.setattr(common, "has_gpu", lambda: False)  # the model run, as on a machine without a GPU
    made = CliRunner().invoke(cli, shlex.split(bash)[1:])
    assert made.exit_code == 0, made.output
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python, "docs/stored-files.md", "exec"), {})  # noqa: S102 -- the page's own example, as written
    assert printed.getvalue() == output
    assert (tmp_path / "breakdown-h200.png").read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------------------ every CPU command, as written

BASH_LINES = [line.split("  #")[0].strip() for text in TEXTS.values()
              for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
              for line in block.splitlines() if line.startswith("mxbench ")]  # fmt: skip
GPU_ONLY = {
    "mxbench ep --nproc 2 --K 7168 --N 2048 --experts 8 --tokens 131072": "times NCCL all-to-alls",
    "mxbench ep --layer --nproc 2 --preset deepseek-v3 --experts 8 --tokens 131072 --groups balanced":
        "times NCCL all-to-alls",
    "mxbench compare single.json sharded.json": "compares two GPU runs made just above it",
    "mxbench compare results/baselines/nvidia-h200.json regress/run.json --format json > regress/verdict.json":
        "compares what `make regress` measured on the GPU",
}  # fmt: skip

def test_every_readme_command_is_run_on_a_cpu_or_named_gpu_only():
    inline = re.findall(r"`(mxbench history [^`]*)`", README)
    assert inline and "mxbench history results/nvidia-h200 results/baselines" in inline
    assert set(GPU_ONLY) <= set(BASH_LINES)  # nothing listed here that the pages no longer say
    assert len(set(BASH_LINES) - set(GPU_ONLY)) >= 8


@pytest.mark.parametrize("line", [x for x in dict.fromkeys(BASH_LINES) if x not in GPU_ONLY and
                                  not x.startswith("mxbench table ")] +  # the tables: run and compared above
                         ["mxbench history results/nvidia-h200 results/baselines"])  # fmt: skip
def test_each_cpu_command_of_the_readme_runs_as_written(line, readme_run):
    done = readme_run(line)  # as a user types it, in a folder that sees the committed runs (readme_runs.py)
    assert done.returncode == 0, done.stdout + done.stderr
    for text in TEXTS.values():
        shown = re.search(re.escape(line) + r"\n```\n\n```\n(.*?)```", text, flags=re.DOTALL)
        if shown:  # the output the page prints below it
            assert done.stdout == shown.group(1)


def test_the_ci_page_states_the_gates_rules_as_compare_does():
    from mxbench.gate.rules import rules_text

    assert rules_text() in TEXTS["docs/ci.md"]
    assert "docs/ci.md" in section("Tracking kernel timings in CI")


# ------------------------------------------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md"))])
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", (REPO / page).read_text(), flags=re.DOTALL)  # links in code are not links
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+://", link) or link.startswith("mailto:"):
            continue
        path, _, anchor = link.partition("#")
        target = (REPO / page).parent / path if path else REPO / page
        assert target.exists(), f"{page}: {link} -> {target.relative_to(REPO) if target.is_relative_to(REPO) else target}"
        if anchor and target.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", target.read_text(), flags=re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{page}: {link}: no heading with that anchor"
