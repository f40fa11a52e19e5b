"""Plain helpers shared by several test modules (pytest puts tests/ on sys.path: ``from helpers import ...``).

Shared fixtures live in conftest.py.
"""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from mxkernels.core.comparison import BitExact
from mxkernels.core.names import Category, Pass, Recipe
from mxkernels.stages.pipeline import Stage
from mxkernels.stages.step_specs import Port, StageSpec

REPO = Path(__file__).resolve().parent.parent


def committed_results() -> list[Path]:
    """The JSON files under results/ that the repository holds (git's index), sorted: a user's own runs there (the
    README's main job writes results/model-b200/) are theirs, not the suite's fixtures. Outside a git checkout
    (an unpacked sdist) every file there is the shipped set."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", "results"], cwd=REPO, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted((REPO / "results").glob("**/*.json"))
    return sorted(REPO / name for name in listed.stdout.decode().split("\0") if name.endswith(".json"))


# ---- fake instruments for the harness ------------------------------------------------------------------------


@dataclass
class FakeTiming:
    samples_us: list
    method: str = "graph-cold"
    calls_per_replay: int = 10
    flush_us: float | None = 0.5
    kernels_per_call: int | None = 1
    memcpy_nodes: int | None = 0
    memset_nodes: int | None = 0
    window_includes_flush: bool | None = None


class FakeTelemetry:
    """A sampler whose counter gains ``WINDOW_J`` joules each time its window is entered."""

    WINDOW_J = 6.0

    def __init__(self):
        self.energy_j = 0.0

    def __enter__(self):
        self.energy_j += self.WINDOW_J
        return self

    def __exit__(self, *exc):
        return False

    def summary(self, calls):
        return {"calls": calls, "sm_clock_mhz": 1980.0, "energy_j_per_call": self.energy_j / calls}


class FakePower:
    """Records every limit set and restored; ``current`` is the limit in force."""

    def __init__(self):
        self.current, self.events = None, []

    @contextmanager
    def applied(self, watts):
        self.events.append(("set", watts))
        self.current = watts
        try:
            yield
        finally:
            self.events.append(("restore", watts))
            self.current = None


def fake_stage(pass_name, name, kernel, category, purpose="", shapes=(), cost=None, backend=None, inputs=(),
               outputs=(), fn=None, recipe="mxfp8"):  # fmt: skip
    """A pipeline ``Stage`` with a spec made up on the spot (harness tests that need no real kernel)."""
    from mxkernels.core.cost import Cost

    from mxbench.storage.results import parse_shapes

    fn = fn or (lambda *args, **kwargs: ())
    spec = StageSpec(Recipe(recipe), name, Pass(pass_name), Category(category), purpose,
                     tuple(Port(i, "") for i in inputs), tuple(Port(o or "_", "") for o in outputs), fn, BitExact(),
                     fn, kernel)  # fmt: skip
    shapes = parse_shapes(shapes) if isinstance(shapes, str) else shapes
    return Stage(spec, shapes, cost or Cost(0, 0), tuple(inputs), tuple(outputs), fn, kernel=kernel, backend=backend)


class FakeGPU:
    """Instruments of a sweep on no GPU: the real plan (stages, costs, implementation names), stages bound to calls
    that do nothing, and a timer that returns ``us`` (+0.1% per sample) for every stage.

    ``on_point(n)`` is called as point n (0-based) is built: a test raises or signals there. ``drop``: stage names
    this "code version" no longer runs.
    """

    def __init__(self, us: float = 10.0, on_point=None, drop=()):
        self.us, self.on_point, self.drop, self.points = us, on_point, set(drop), 0

    def build(self, recipe, M, N, K, G, sizes, *, mode, backend, device, seed, impls=None):
        from dataclasses import replace

        from mxkernels.stages.pipeline import plan_step

        if self.on_point is not None:
            self.on_point(self.points)
        self.points += 1
        stages = plan_step(recipe, M, N, K, G, sizes, mode=mode, backend=backend, impls=impls)
        return [replace(s, run=lambda: None) for s in stages]

    def plan(self, *args, **kwargs):
        from mxkernels.stages.pipeline import plan_step

        return [s for s in plan_step(*args, **kwargs) if s.name not in self.drop]

    def time_fn(self, fn, *, cold_l2, use_graph, samples, window=None):
        fn()
        with window() if window else FakeTelemetry():
            pass
        return FakeTiming([self.us * (1 + 0.001 * i) for i in range(samples)])

    def instruments(self):
        from mxbench.instruments.kit import Instruments

        def build(*args, **kwargs):
            return [s for s in self.build(*args, **kwargs) if s.name not in self.drop]

        return Instruments(
            plan_step=self.plan, build_step=build, end_to_end=lambda *a, **k: (lambda: None), time_fn=self.time_fn,
            telemetry=FakeTelemetry, snapshot=lambda: {"driver_version": "999.1"},
            device_properties=lambda: {"name": "Fake GPU", "uuid": "GPU-fake"}, ceilings=_no_ceilings,
            release=lambda: None, power=FakePower(), make_power=FakePower,
        )  # fmt: skip


def _no_ceilings(card: str):
    """The fake card has no measured ceilings; asked, as the real lookup is, by the card's name (a string)."""
    if not isinstance(card, str):
        raise TypeError(f"ceilings are looked up by the card's name, got {type(card).__name__}")


def with_flipped_bits(quantize, index: tuple[int, int], mask: int):
    """``quantize`` (a quantize_a implementation) with bits ``mask`` of its data byte at ``index`` flipped: a
    quantizer wrong in exactly one byte, which ``check`` must catch and name."""

    def flipped(a, *, mode):
        q, s = quantize(a, mode=mode)
        q = q.clone()
        q.view(torch.uint8)[index] ^= mask
        return q, s

    return flipped

