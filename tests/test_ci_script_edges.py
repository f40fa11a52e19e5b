"""What a CI script hits when it drives mxbench: folders wherever files are read, help that states only options that
exist, machine formats with nothing else on stdout."""

from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner
from test_cli import synthetic_run

import mxbench
from mxbench.cli import cli
from mxbench.storage.results import save_run


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_folder_with_a_tuning_scripts_json_list_loads(tmp_path):
    save_run(synthetic_run(), tmp_path / "run.json")
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "tune.json").write_text(json.dumps([{"config": 1, "us": 3.0}]))
    assert len(mxbench.load(tmp_path)) == len(synthetic_run().records)


def test_table_reads_a_folder_and_passes_over_runs_of_another_kind(tmp_path):
    save_run(synthetic_run(), tmp_path / "roofline.json")
    peers = mxbench.storage.results.Run(meta={**synthetic_run().meta, "kind": "peers"}, records=synthetic_run().records)
    save_run(peers, tmp_path / "peers.json")
    result = invoke("table", tmp_path, "--kind", "breakdown", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert "quantize_dim0" in result.output
    assert invoke("table", tmp_path / "peers.json", "--kind", "breakdown").exit_code == 2  # named: must fit


def test_regress_help_states_only_its_own_options():
    text = invoke("regress", "--help").output
    assert "--force" not in text and "--allow-missing" in text and "--threshold" in text and "--impl" in text


def test_impls_csv_of_one_stage_is_csv_alone():
    result = CliRunner().invoke(cli, ["impls", "--stage", "quantize_a", "--format", "csv"])
    assert result.exit_code == 0
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0][:2] == ["Recipe", "Stage"] and all(r[1] == "quantize_a" for r in rows[1:])
    assert "contract: quantize_a(a, *, mode)" in result.stderr


def test_torchaos_import_noise_stays_off_stderr(tmp_path, monkeypatch, capfd):
    """torchao warns and logs at import about optional kernels it cannot load: not on every command's stderr."""
    import logging
    import sys

    from mxbench.implementations import builtin as implementations

    package = tmp_path / "torchao"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import logging, warnings\n__version__ = '0.0.test'\nwarnings.warn('Skipping import of cpp extensions')\n"
        "logging.getLogger('torchao').warning('fbgemm not found')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchao", raising=False)
    logging.getLogger("torchao").addHandler(logging.StreamHandler(sys.stderr))
    try:
        assert implementations.torchao_version() == "0.0.test"
    finally:
        logging.getLogger("torchao").handlers.clear()
    assert capfd.readouterr().err == ""
