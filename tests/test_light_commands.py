"""The commands that only read stored runs (EP projections and tables, history) never import torch, triton or
matplotlib: each of those costs a user (and every README command the suite runs) seconds per call (issue 31).
Checked in one fresh process, so that nothing the suite imported hides an import. (The step's table reads the stages'
declarations in mxkernels, which import torch; the layer's amortizes by the weight-only stages' names alone.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
H100, H200 = "results/nvidia-h100-80gb-hbm3", "results/nvidia-h200"
COMMANDS = [
    ["ep-project", f"{H100}/ep/ep4-deepseek-v3.json", "--top-k", "8", "--intra-from-run", "--format", "markdown"],
    ["ep-project", f"{H200}/ep/ep-layer-deepseek-v3-skewed-ep2.json", "--validate",
     f"{H200}/ep/ep-layer-deepseek-v3-skewed-ep4.json", "--intra-from-run"],  # skewed: the routing's shares
    ["table", f"{H200}/ep/ep-layer-deepseek-v3-balanced-ep2.json", f"{H200}/ep/ep-layer-deepseek-v3-balanced-ep4.json",
     "--kind", "ep-scaling"],
    ["history", H200, "results/baselines"],
    ["table", f"{H200}/layer-qwen3-30b-a3b-wgrad-bf16-seventh.json", "--kind", "layer"],  # 8 microbatches: amortized
]  # fmt: skip
HEAVY = ("torch", "triton", "matplotlib")
RUN_ALL = f"""
import sys
from mxbench.cli import main
for args in {COMMANDS!r}:
    try:
        main(args)
    except SystemExit as e:
        if e.code:
            raise
print("imported:", *[m for m in {HEAVY!r} if m in sys.modules])
"""


def test_commands_that_read_stored_runs_import_no_torch_triton_or_matplotlib():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", RUN_ALL], capture_output=True, text=True, timeout=600, env=env,
                          cwd=REPO, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "imported:", done.stdout.splitlines()[-1]
