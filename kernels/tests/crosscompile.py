"""Cross-compile a Triton kernel for a GPU that is not here (SM90, SM100) and return its PTX.

Compilation runs in a subprocess because this test process runs under the interpreter (TRITON_INTERPRET=1), where
``triton.jit`` does not produce compilable kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    spec = json.loads(sys.argv[1])
    module = importlib.import_module(spec["module"])
    fn = getattr(module, spec["kernel"])
    # A constexpr {"jit": "module:name"} is that jit function (a rows kernel's tile producer).
    for key, value in spec["constexprs"].items():
        if isinstance(value, dict):
            where, name = value["jit"].split(":")
            spec["constexprs"][key] = getattr(importlib.import_module(where), name)
    # What the runtime launcher knows of real arguments: pointers and sizes divisible by 16 (16-byte accesses).
    names = list(spec["signature"])
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec["aligned"]}
    src = ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"], attrs=attrs or None)
    compiled = triton.compile(src, target=GPUTarget("cuda", spec["cc"], 32), options=spec["options"])
    sys.stdout.write(compiled.asm["ptx"])
    """
)


def compile_ptx(
    module: str,
    kernel: str,
    signature: dict,
    constexprs: dict,
    cc: int,
    aligned: tuple[str, ...] = (),
    options: dict | None = None,
) -> str:
    """PTX of ``module.kernel`` built for compute capability ``cc`` (90 or 100).

    ``signature`` maps every argument name to a Triton type string ("*fp32", "*u8", "i32", "i64", "constexpr");
    ``constexprs`` gives the constexpr values by name (a jit function as ``{"jit": "module:name"}``). ``aligned`` names the arguments (pointers, sizes, strides)
    to treat as divisible by 16, as the runtime launcher does for real tensors and sizes; without it the PTX can
    only show the byte-wise accesses a misaligned launch would get.
    """
    spec = {
        "module": module, "kernel": kernel, "signature": signature, "constexprs": constexprs, "cc": cc,
        "aligned": list(aligned), "options": options or {},
    }  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=600
    )
    if proc.returncode:
        raise AssertionError(f"compiling {module}.{kernel} for sm_{cc} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout
