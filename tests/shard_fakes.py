"""The work and the fake instruments of the sharded sweeps (tests/test_shard.py), apart from the tests: the workers
of tests/shard_crash.py import these alone, not test_shard's imports (regress, compare and pandas), which each
rank would pay for on every launch (issue 31)."""

from __future__ import annotations

from mxbench.measuring.stages import SweepOptions
from mxbench.plan.points import plan_points

WORLD = 2
POINTS = plan_points([64, 128, 256], 64, 32, 2, ["mxfp8", "bf16"], power_limits=[250.0, 300.0])
"""Six units (three M at two power limits), each an mxfp8 point and its bf16 baseline."""


def fakes_for(rank: int, card: str = "Fake GPU"):
    """Fake instruments of ``rank``'s GPU (``test_sweep.Fakes``) and the Fakes that record what they measured."""
    from test_sweep import Fakes

    f = Fakes()
    ins = f.instruments()
    ins.device_properties = lambda: {"name": card, "uuid": f"GPU-{rank}"}
    return f, ins


def sweep_options(out=None, rank=0):
    return SweepOptions(samples=3, device=rank, out=out)
