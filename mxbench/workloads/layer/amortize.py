"""The layer step amortized over gradient-accumulation microbatches, from a run's records.

A trainer that accumulates gradients over N microbatches per optimizer step changes its weights once per N
forward + backward passes, so the stages that read weights alone (``StageSpec.weights_only``: the weights'
quantized copies and their scale rearranges) need to run once per N (Transformer Engine's first-microbatch
caching). The amortized step is the one-graph step less (N - 1) / N of those stages' times, each as timed alone:

    amortized = step - (1 - 1/N) * sum(weight-only stages)

A step that ran the forward's weight stages on a second stream (the layer runs of commit 6bb05da, an experiment
taken back out: docs/perf-log.md, "The weights' quantizers beside the routing") hid part of their time in the step
already; such a record stores the step with the stages in order beside it (telemetry ``in_order_step_us``). The
first microbatch takes the overlapped step, the N - 1 others the in-order step less the stages' times:

    amortized = (step + (N - 1) * (in_order - sum(weight-only stages))) / N

(the first form when in_order = step). bf16 has no such stages: its amortized step is its step.
"""

from __future__ import annotations

from collections.abc import Sequence

from mxkernels.core.names import END_TO_END_STAGE, WEIGHT_ONLY_STAGES

from ...storage.results import Record


def is_weights_only(record: Record) -> bool:
    """Whether the record's stage is a weights-only one (a projection's stage, named ``role.stage``;
    ``mxkernels.core.names.WEIGHT_ONLY_STAGES``, the names every spec of them carries as ``weights_only``)."""
    return record.stage.rsplit(".", 1)[-1] in WEIGHT_ONLY_STAGES


def weight_only_us(records: Sequence[Record]) -> float | None:
    """Sum of one point's weight-only stage times; None where one of them was not measured."""
    stages = [r for r in records if r.stage != END_TO_END_STAGE and is_weights_only(r)]
    if not all(r.ok and r.median_us is not None for r in stages):
        return None
    return sum(r.median_us for r in stages)


def amortized_us(step_us: float | None, records: Sequence[Record], microbatches: int,
                 in_order_us: float | None = None) -> float | None:  # fmt: skip
    """The step amortized over ``microbatches`` (module doc); ``in_order_us``: the step with the weight stages in
    order, where ``step_us`` overlapped them (None: it did not, as every run now). None where the step or a
    weight-only stage is missing."""
    weights = weight_only_us(records)
    if step_us is None or weights is None:
        return None
    in_order = step_us if in_order_us is None else in_order_us
    return (step_us + (microbatches - 1) * (in_order - weights)) / microbatches
