"""What torch's build can run on a compute capability 10.x GPU, read from ``torch.__config__.show()``: the first half
of native MXFP8's probe (``gemm_native.probe_mxfp8``; the second half is a known-answer GEMM on the device).

It decides from what the build can do, not from how a build option is spelled. torch's own CUDA kernels are
compiled for the targets of its gencode list -- the "NVCC architecture flags" line of the config text, the list
``torch.cuda.get_arch_list()`` returns -- and a build whose list holds no target that runs on the device has no
kernel image of torch's for it, its grouped GEMMs included. Which library carries the MX kernels is left to the
known-answer GEMM: it has changed (fbgemm's GenAI kernels up to about torch 2.10, MSLK after) and is spelled
differently from build to build (torch 2.11.0+cu130 says so only as ``-DUSE_MSLK`` inside CXX_FLAGS).

torch prints the CUDA lines of its config text only where it sees a GPU (torch 2.6.0+cu124 on a host without one
prints none): always so where the probe runs, on a 10.x device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_NVCC_LINE = re.compile(r"^\s*-\s*NVCC architecture flags:\s*(\S*)", re.MULTILINE)
_TORCH_VERSION = re.compile(r"\bTORCH_VERSION=([\w.+]+)")
# A gencode target: "sm_" (a cubin) or "compute_" (PTX, compiled on the device), the compute capability with its
# last digit the minor version (sm_90: 9.0, sm_100: 10.0, sm_120: 12.0), and a suffix: "a" (arch-specific: that
# exact capability only) or "f" (family: that capability and later minors of the same major).
_TARGET = re.compile(r"\b(sm|compute)_(\d+)(\d)([af]?)\b")


class Code(StrEnum):
    CUBIN = "sm"  # machine code for one architecture
    PTX = "compute"  # compiled by the driver on the device


@dataclass(frozen=True)
class Target:
    """One gencode target of a build, e.g. sm_100 or sm_100a."""

    code: Code
    major: int
    minor: int
    suffix: str  # "", "a" or "f"

    def __str__(self) -> str:
        return f"{self.code}_{self.major}{self.minor}{self.suffix}"

    def runs_on(self, cap: tuple[int, int]) -> bool:
        """Whether code for this target runs on compute capability ``cap``: same major version, and an
        "a" target on its own minor only, others on their minor and later ones (CUDA's compatibility rule). A target of
        another major is refused even as PTX: compiled for an older architecture, it holds no SM100 code."""
        if self.major != cap[0]:
            return False
        return cap[1] == self.minor if self.suffix == "a" else cap[1] >= self.minor


@dataclass(frozen=True)
class Build:
    """What a torch build's config text says about its CUDA kernels. ``targets`` is empty for a build without CUDA
    (or a config text printed where no GPU was seen)."""

    version: str | None  # TORCH_VERSION of the build settings
    targets: tuple[Target, ...]

    def runs_on(self, cap: tuple[int, int]) -> tuple[Target, ...]:
        """The targets whose code runs on compute capability ``cap``."""
        return tuple(t for t in self.targets if t.runs_on(cap))

    def refusal(self, cap: tuple[int, int]) -> str | None:
        """Why this build cannot run torch's kernels on ``cap``, naming what was found; None when it can."""
        name = f"torch {self.version}" if self.version else "this torch build"
        if not self.targets:
            return (f"{name} lists no CUDA targets (torch.__config__.show() has no NVCC architecture flags): "
                    "a build without CUDA")  # fmt: skip
        if not self.runs_on(cap):
            return (f"{name} was compiled for {', '.join(map(str, self.targets))} (torch.__config__.show(), NVCC "
                    f"architecture flags): none runs on compute capability {cap[0]}.{cap[1]}")  # fmt: skip
        return None

    def finding(self, cap: tuple[int, int]) -> str:
        """What was found, in one phrase, for a build that can run on ``cap``."""
        name = f"torch {self.version}" if self.version else "this torch build"
        return (f"{name} carries {', '.join(map(str, self.runs_on(cap)))} for compute capability {cap[0]}.{cap[1]} "
                f"(of {', '.join(map(str, self.targets))})")  # fmt: skip


def parse_targets(gencode: str) -> tuple[Target, ...]:
    """The ``code=`` targets of a gencode list (``-gencode;arch=compute_90,code=sm_90;...``), in order, once each;
    as strings they are what ``torch.cuda.get_arch_list()`` returns for the build."""
    found: dict[str, Target] = {}
    for flag in gencode.split(";"):
        _, _, codes = flag.partition("code=")
        for code, major, minor, suffix in _TARGET.findall(codes):
            target = Target(Code(code), int(major), int(minor), suffix)
            found.setdefault(str(target), target)
    return tuple(found.values())


def read_build(config: str) -> Build:
    """The ``Build`` that a ``torch.__config__.show()`` text describes."""
    gencode = _NVCC_LINE.search(config)
    version = _TORCH_VERSION.search(config)
    return Build(version.group(1) if version else None, parse_targets(gencode.group(1)) if gencode else ())
