"""Cross-compile the launches ``tune_weight_quantizers.py`` times for sm_90 without a GPU and print each kernel's
resources (registers, spill stores/loads, stack frame, shared memory) and the programs an SM its registers allow:
what the compiler says before any device time is spent. Run it with the Triton of the GPU machine ahead on the path
(3.6 there; any other installed one here), e.g.

    mkdir -p /tmp/t36 && cd /tmp/t36 && pip download --no-deps triton==3.6.0 && python -m zipfile -e triton-3.6.0-*.whl .
    chmod +x /tmp/t36/triton/backends/nvidia/bin/*
    PYTHONPATH=/tmp/t36:kernels:. python scripts/crosscompile_weight_quantizers.py [--quick] [--jobs 2]

Each kernel compiles in its own process (``--jobs`` at a time), as under pytest's interpreter a kernel cannot compile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts")]

_COMPILE = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from mxkernels.quant import fp8_colwise as C, fp8_hold as H
spec = json.loads(sys.argv[1])
hold = spec["kernel"] == "hold"
fn = H._hold_kernel if hold else C._walk_kernel
names = ["x_ptr"] + (["xw_ptr"] if hold else []) + ["offs_ptr", "q_ptr", "scale_ptr", "rows", "cols", "G", "PROGRAMS",
         "stride_xg", "stride_xm", "stride_xc"] + (["stride_wg", "stride_wm"] if hold else []) + ["stride_qg", "stride_qc"]
types = {"x_ptr": "*bf16", "xw_ptr": "*i32", "offs_ptr": "*i32", "q_ptr": "*u8", "scale_ptr": "*fp32"}
sig = {n: types.get(n, "i32") for n in names}
sig["stride_xc"] = "constexpr"
sig.update({c: "constexpr" for c in spec["constexprs"]})
aligned = [n for n in names if n not in ("G", "PROGRAMS", "offs_ptr", "stride_xc")]
attrs = {(list(sig).index(a),): [["tt.divisibility", 16]] for a in aligned}
src = ASTSource(fn=fn, signature=sig, constexprs={**spec["constexprs"], "stride_xc": 1}, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=spec["options"])
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
ptx = k.asm["ptx"]
print(json.dumps({"usage": usage, "shared": k.metadata.shared, "triton": triton.__version__,
                  "ld_v4": ptx.count("ld.global.v4"), "st_v4": ptx.count("st.global.v4"),
                  "cp_async": ptx.count("cp.async"), "ld_local": ptx.count("ld.local")}))
"""


def spec_of(config, has_offs: bool) -> dict:
    from mxkernels.quant import fp8_hold as H

    if isinstance(config, H.HoldConfig):
        constexprs = {
            "HAS_OFFS": has_offs,
            "STRIP": config.strip_cols,
            "HOLD": config.hold_rows,
            "STEP": config.step_rows,
            "PACKED": config.packed,
            "PREFETCH": config.prefetch,
            "PERSISTENT": config.persistent,
            "EXACT": False,
        }
        options = {"num_warps": config.num_warps, **({"maxnreg": config.max_registers} if config.max_registers else {})}
        return {"kernel": "hold", "constexprs": constexprs, "options": options}
    constexprs = {"HAS_OFFS": has_offs, "STRIP": config.strip_cols, "STEP": config.step_rows,
                  "STAGES": config.num_stages, "PREFETCH": config.prefetch, "EXACT": False}  # fmt: skip
    options = {"num_warps": config.num_warps, **({"maxnreg": config.max_registers} if config.max_registers else {})}
    return {"kernel": "walk", "constexprs": constexprs, "options": options}


def compile_one(spec: dict) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1",
           "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="xq-")}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(spec)], capture_output=True, text=True, env=env,
                          timeout=1200, check=False)  # fmt: skip
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1][:200]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out["usage"])
    if m:
        out.update(regs=int(m[1]), stack=int(m[2]), local=int(m[4]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the --quick candidates only")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    import tune_weight_quantizers as T

    todo = {}
    for case in T.CASES:
        for config in T.candidates(case, args.quick):
            config = config if config is not None else T.default_config(case)
            if hasattr(config, "split"):  # the strips kernel: unchanged here
                continue
            todo[(T.label(config), case.kind)] = (config, spec_of(config, case.kind == "k_groups"))
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(todo, pool.map(lambda key: compile_one(todo[key][1]), todo)))
    print(f"{'launch':44s} {'kind':9s} {'regs':>4s} {'stack':>5s} {'ld.local':>8s} {'smem':>6s} {'/SM by regs':>11s} "
          f"{'ld.v4':>5s} {'st.v4':>5s} {'cp.async':>8s}")  # fmt: skip
    for (name, kind), r in results.items():
        config = todo[(name, kind)][0]
        if "error" in r:
            print(f"{name:44s} {kind:9s} FAILED {r['error']}")
            continue
        per_sm = 65536 // (max(r["regs"], 1) * 32 * config.num_warps) if r.get("regs") else 0
        print(f"{name:44s} {kind:9s} {r.get('regs', '?'):>4} {r.get('stack', '?'):>5} {r['ld_local']:>8} "
              f"{r['shared']:>6} {per_sm:>5} (of {config.programs_per_sm}) {r['ld_v4']:>5} {r['st_v4']:>5} "
              f"{r['cp_async']:>8}")  # fmt: skip
    print(f"triton {next(iter(results.values())).get('triton', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
