"""Cross-compile a Triton kernel for a GPU that is not here (SM90, SM100) and return its PTX.

Compilation runs in a subprocess because this test process runs under the interpreter (TRITON_INTERPRET=1), where
``triton.jit`` does not produce compilable kernels. One subprocess per test process serves every build, one JSON
request a line: a fresh interpreter per build spent most of a build's time importing torch and triton again (about
3 of a cached build's 3.5 CPU-seconds). A build is ``triton.compile`` of one ASTSource for one target, which keeps
no state between builds, so the PTX is the same as from a fresh process. The same build asked again (several tests
asserting one kernel) is compiled once.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import threading

_SCRIPT = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback
    # Replies go out on the real stdout alone: anything else that writes to fd 1 (a compiler's chatter) goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget

    def build(spec):
        module = importlib.import_module(spec["module"])
        fn = getattr(module, spec["kernel"])
        # A constexpr {"jit": "module:name"} is that jit function (a rows kernel's tile producer).
        constexprs = dict(spec["constexprs"])
        for key, value in constexprs.items():
            if isinstance(value, dict):
                where, name = value["jit"].split(":")
                constexprs[key] = getattr(importlib.import_module(where), name)
        # What the runtime launcher knows of real arguments: pointers and sizes divisible by 16 (16-byte accesses).
        names = list(spec["signature"])
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in spec["aligned"]}
        src = ASTSource(fn=fn, signature=spec["signature"], constexprs=constexprs, attrs=attrs or None)
        compiled = triton.compile(src, target=GPUTarget("cuda", spec["cc"], 32), options=spec["options"])
        return compiled.asm["ptx"]

    for line in sys.stdin:
        try:
            reply = {"ptx": build(json.loads(line))}
        except BaseException:
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\\n")
        replies.flush()
    """
)
_TIMEOUT_S = 600


class _Server:
    """The build subprocess of this test process, started at the first build; a build that kills it (or outlasts
    the timeout) fails and the next build starts a new one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc = None
        self.log = None

    def _start(self):
        env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- lives as long as the server
        self.proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env)  # fmt: skip

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.close()

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def build(self, spec: dict, what: str) -> str:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.stop()
                self._start()
            try:
                self.proc.stdin.write(json.dumps(spec) + "\n")
                self.proc.stdin.flush()
                ready, _, _ = select.select([self.proc.stdout], [], [], _TIMEOUT_S)
                line = self.proc.stdout.readline() if ready else ""
            except BrokenPipeError:
                ready, line = True, ""
            if not line:
                why = f"exited {self.proc.wait()}" if ready else f"took over {_TIMEOUT_S} s"
                tail = self._log_tail()
                self.stop()
                raise AssertionError(f"compiling {what} failed: the build process {why}:\n{tail}")
            reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"compiling {what} failed:\n{reply['error'][-4000:]}")
        return reply["ptx"]


_SERVER = _Server()
atexit.register(_SERVER.stop)


@functools.cache
def _compile(spec_json: str, what: str) -> str:
    return _SERVER.build(json.loads(spec_json), what)


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
    # Not sort_keys: the signature's order is the arguments' order.
    return _compile(json.dumps(spec), f"{module}.{kernel} for sm_{cc}")
