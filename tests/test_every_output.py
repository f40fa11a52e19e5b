"""One write path for every output (issue 34, item 1) and one reader for every input (item 3).

Outputs: a file that is not an output mxbench wrote of the same kind (a run, a figure, a table) is never replaced
without --force; what is replaced is kept in .replaced/ and named; names that cannot be written (empty, a folder, a
symlink loop, a folder the user cannot write) are refused before any work. Inputs: a FIFO, a device or a folder is
refused at once (never blocking), a file past 64 MiB is refused with its size."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxbench.cli import cli
from mxbench.storage.marks import FIGURE_MARK
from mxbench.storage.writing import REPLACED_DIR

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "results/nvidia-h100-80gb-hbm3/roofline-deepseek-v3.json"
EP_RUN = REPO / "results/nvidia-h100-80gb-hbm3/ep/ep-deepseek-v3.json"
ROOFLINE = ["roofline", "--K", "256", "--N", "128", "--M", "1024"]
TINY_EP = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def refused(result, wanted: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output[-1500:])
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    assert wanted in " ".join(result.output.split()), result.output


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """RUN cut to its first record (one stage at one point): its figures still go through the one write path, a sheet
    of two panels rather than every panel of 200 records (the write path does not depend on what is drawn)."""
    from mxbench.storage.results import Run, load_run, save_run

    full = load_run(RUN)
    path = tmp_path_factory.mktemp("small-run") / "roofline-one-record.json"
    save_run(Run(full.meta, full.records[:1]), path)
    return path


@pytest.fixture
def ep_run(tmp_path) -> Path:
    path = tmp_path / "ep.json"
    shutil.copy(EP_RUN, path)
    shutil.copy(EP_RUN.with_suffix(".csv"), path.with_suffix(".csv"))
    return path


# ------------------------------------------------------------------------------------------------ lost files


def test_ep_project_out_never_replaces_its_own_input_run(ep_run):
    before = ep_run.read_bytes()
    refused(invoke("ep-project", ep_run, "--out", ep_run), "is not a text output mxbench wrote; give --force")
    assert ep_run.read_bytes() == before and not (ep_run.parent / REPLACED_DIR).exists()


def test_ep_project_out_with_force_keeps_the_run_in_replaced(ep_run):
    before = ep_run.read_bytes()
    done = invoke("ep-project", ep_run, "--out", ep_run, "--force")
    assert done.exit_code == 0, done.output
    (kept,) = (ep_run.parent / REPLACED_DIR).glob("ep.*.json")
    assert kept.read_bytes() == before and f"the old copy is at {kept}" in done.output


@pytest.mark.parametrize("fmt", ["markdown", "csv", "plain", "json"])
def test_ep_project_replaces_its_own_projection_and_keeps_the_old_one(ep_run, tmp_path, fmt):
    out = tmp_path / f"proj.{fmt}"
    assert invoke("ep-project", ep_run, "--format", fmt, "--out", out).exit_code == 0
    first = out.read_bytes()
    again = invoke("ep-project", ep_run, "--format", fmt, "--out", out, "--ep", "8,16")
    assert again.exit_code == 0, again.output
    (kept,) = (tmp_path / REPLACED_DIR).glob("proj.*")
    assert kept.read_bytes() == first and out.read_bytes() != first


def test_a_users_json_is_not_replaced_by_a_projection(ep_run, tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    refused(invoke("ep-project", ep_run, "--format", "json", "--out", notes), "--out")
    assert notes.read_text() == '{"my": "notes"}'


@pytest.mark.parametrize("command", [
    lambda out, run: ["plot", run, "--out", out],
    lambda out, run: ["history", run, "--plot", out],
    lambda out, run: ["ep-project", EP_RUN, "--plot-file", out],
    lambda out, run: [*ROOFLINE, "--out", out.with_name("r.json"), "--plot-file", out],
])  # fmt: skip
def test_a_figure_path_holding_a_file_that_is_not_our_figure_is_refused_then_forced(tmp_path, command, small_run):
    out = tmp_path / "existing.png"
    out.write_bytes(b"\x89PNG\r\n\x1a\n my holiday photo")
    refused(invoke(*command(out, small_run)), "is not a figure mxbench wrote; give --force")
    assert out.read_bytes() == b"\x89PNG\r\n\x1a\n my holiday photo"
    assert not list(tmp_path.glob("r.*"))  # checked before any work: no run written either
    forced = invoke(*command(out, small_run), "--force")
    assert forced.exit_code == 0, forced.output
    (kept,) = (tmp_path / REPLACED_DIR).glob("existing.*.png")
    assert kept.read_bytes() == b"\x89PNG\r\n\x1a\n my holiday photo" and f"the old copy is at {kept}" in forced.output
    assert FIGURE_MARK.encode() in out.read_bytes()


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_our_figure_is_recognized_and_replaced_with_its_copy_kept(tmp_path, suffix, small_run):
    out = tmp_path / f"fig{suffix}"
    assert invoke("plot", small_run, "--out", out).exit_code == 0
    first = out.read_bytes()
    assert FIGURE_MARK.encode() in first
    again = invoke("plot", small_run, "--out", out)
    assert again.exit_code == 0, again.output
    (kept,) = (tmp_path / REPLACED_DIR).glob(f"fig.*{suffix}")
    assert kept.read_bytes() == first


def test_a_folder_of_figures_does_not_replace_a_users_file_in_it(tmp_path, small_run):
    folder = tmp_path / "figs"
    assert invoke("plot", small_run, "--out", folder).exit_code == 0
    mine = sorted(folder.glob("*.png"))[0]
    mine.write_bytes(b"not a figure of mxbench's")
    refused(invoke("plot", small_run, "--out", folder), "is not a figure mxbench wrote")
    assert mine.read_bytes() == b"not a figure of mxbench's"
    assert invoke("plot", small_run, "--out", folder, "--force").exit_code == 0


def test_ep_check_out_never_replaces_a_file_that_is_not_a_check_record(tmp_path, monkeypatch):
    from mxbench.workloads.ep import worker

    monkeypatch.setattr(worker, "run_worker", lambda *a, **k: pytest.fail("the check ran"))
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    refused(invoke("ep", "--check", *TINY_EP, "--out", notes), "is not a text output mxbench wrote; give --force")
    assert notes.read_text() == '{"my": "notes"}'


# ------------------------------------------------------------------------------------ names that cannot be written


@pytest.mark.parametrize("args", [
    [*ROOFLINE, "--out", ""],
    [*ROOFLINE, "--out", "."],
    ["ep-project", EP_RUN, "--out", ""],
    ["plot", EP_RUN, "--out", ""],  # '' read as the working folder: the figure landed there
    ["history", RUN, "--plot", ""],
    ["map", "--K", "256", "--N", "128", "--experts", "4", "--tokens-per-expert", "64", "--plot-dir", ""],
])  # fmt: skip
def test_an_empty_output_name_is_refused_with_one_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("make", ["loop", "dangling"])
@pytest.mark.parametrize("command", [
    lambda out: [*ROOFLINE, "--out", out],
    lambda out: ["ep-project", EP_RUN, "--out", out],
    lambda out: ["plot", RUN, "--out", out.with_suffix(".png")],
])  # fmt: skip
def test_a_symlink_that_leads_nowhere_is_refused_before_any_work(tmp_path, make, command):
    out = tmp_path / "link.json"
    if make == "loop":
        out.symlink_to(out)
        out.with_suffix(".png").symlink_to(out.with_suffix(".png"))
    else:
        out.symlink_to(tmp_path / "gone" / "x.json")
        out.with_suffix(".png").symlink_to(tmp_path / "gone" / "x.png")
    result = invoke(*command(out))
    refused(result, "a symbolic link that leads nowhere")


def test_a_folder_the_user_cannot_write_is_refused_before_any_work(tmp_path, monkeypatch):
    """As the running user (os.access), not only as root: the tests run as root, so the user's view is simulated."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == locked else real(p, mode, **k))
    for args in ([*ROOFLINE, "--out", locked / "r.json"], ["ep-project", EP_RUN, "--out", locked / "p.md"],
                 ["plot", RUN, "--out", locked / "f.png"], ["history", RUN, "--plot", locked / "h.png"]):
        refused(invoke(*args), f"cannot write in {locked} (Permission denied)")
    assert not list(locked.iterdir())


# ---------------------------------------------------------------------------------------------- inputs


def _fifo(tmp_path) -> Path:
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.parametrize("command", [
    lambda p: ["table", p], lambda p: ["compare", RUN, p], lambda p: ["compare", p, RUN], lambda p: ["plot", p, "--out",
    p.with_name("x.png")], lambda p: ["history", p], lambda p: ["ep-project", p], lambda p: ["regress", "--baseline", p],
])  # fmt: skip
def test_a_fifo_is_refused_at_once_never_blocking(tmp_path, command):
    fifo = _fifo(tmp_path)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", invoke(*command(fifo))), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # unblock it: a writer opens the FIFO
        with open(fifo, "w"):
            pass
        pytest.fail("the command blocked on a FIFO")
    refused(box["r"], "FIFO")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_at_once(device):
    for args in (["table", device], ["compare", RUN, device], ["ep-project", device], ["regress", "--baseline", device]):
        refused(invoke(*args), "a character device")


def test_a_folder_named_as_a_run_is_refused():
    from mxkernels.core.errors import InputError

    from mxbench.storage.results import load_run

    with pytest.raises(InputError, match="it is a folder"):
        load_run(REPO / "results")


def test_a_file_past_the_cap_is_refused_with_its_size(tmp_path, monkeypatch):
    from mxbench.storage import reading

    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    monkeypatch.setattr(reading, "MAX_BYTES", 1024)
    monkeypatch.setattr(reading.read_input, "__defaults__", ("mxbench file", 1024))
    monkeypatch.setattr(reading.read_text, "__defaults__", ("mxbench file", 1024))
    refused(invoke("table", big), "2048 bytes, past the 1024 bytes an input may have")
    refused(invoke("compare", big, big), "2048 bytes")
