"""The instruments a sweep measures with, behind one injectable bundle: the real GPU ones, or a test's fakes."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Instruments:
    """Everything ``run_sweep`` measures with. ``Instruments.real()`` binds the GPU implementations; tests pass
    fakes. ``power`` is a ``PowerController``, made on first use (only when a point asks for a limit)."""

    plan_step: Callable[..., list]
    build_step: Callable[..., list]
    end_to_end: Callable[..., Callable[[], object]]
    time_fn: Callable[..., Any]
    telemetry: Callable[[], Any]
    snapshot: Callable[[], dict]
    device_properties: Callable[[], dict]
    ceilings: Callable[[str], Any]
    release: Callable[[], None]
    power: Any = None
    make_power: Callable[[], Any] | None = None
    step_env: Callable[..., dict] | None = None
    """(bound stages, M, N, K, G, group sizes, device=, seed=) -> every tensor of the step by name, the stages run
    from inputs of that seed: the second input values the timed calls alternate with (``measuring.fresh``). None:
    the stages are timed on their first values alone (a test's fakes)."""

    def controller(self):
        if self.power is None:
            self.power = self.make_power()
        return self.power

    @classmethod
    def real(cls, device: int = 0, results_dir: Path = Path("results"), power=None) -> Instruments:
        import torch
        from mxkernels.autograd import projection
        from mxkernels.stages import pipeline

        from . import ceiling_store
        from . import hardware
        from . import power as nvml_power
        from .timing import time_fn

        def step_env(stages, M, N, K, G, group_sizes, *, device, seed):
            return pipeline.run_stages(stages, pipeline.make_inputs(M, N, K, G, group_sizes, device=device, seed=seed))

        def release():
            gc.collect()
            torch.cuda.empty_cache()

        return cls(
            plan_step=pipeline.plan_step,
            build_step=pipeline.build_step,
            end_to_end=projection.end_to_end,
            time_fn=time_fn,
            telemetry=lambda: nvml_power.TelemetrySampler(device),
            snapshot=lambda: nvml_power.snapshot(device),
            device_properties=lambda: hardware.device_properties(device),
            ceilings=lambda card: ceiling_store.load_ceilings(results_dir, card),
            release=release,
            power=power,
            make_power=lambda: nvml_power.PowerController(device),
            step_env=step_env,
        )
