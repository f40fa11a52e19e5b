"""Fresh inputs for timed calls: a second set of valid values for every stage's input buffers, and the check of the
last timed call's outputs against the stage's oracle on those values (``instruments.timing``'s ``Fresh``).

An implementation that remembers its output per input buffer, does the work only on its first call or notices the
CUDA-graph capture computes nothing when timed; the timer's graph replays would then report the time of whatever
little work it left (a copy, a no-op kernel). Writing other values into the same buffers between timed calls and
holding the last call's outputs to the oracle (the stage's own comparison rule, the implementation's declared
deviation allowed) turns that into an error row.

The second set is the whole step run again from inputs of another seed (``SECOND_SEED``) with the same token groups:
every stage's inputs are then valid for its contract (scales matching their data, the same group ends), as the first
set's are. It is built once per point (as much memory again as the step's tensors) and each stage's first values are
kept while the stage is timed (its input bytes again) and written back after, so that the next stage starts from
the values the first set's step produced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import torch

from ..implementations.check import Verdict, judge

SECOND_SEED = 0x5EED
"""Added to a point's seed for the second input set: any other seed gives other values."""


@dataclass
class FreshInputs:
    """One stage's input ``buffers`` (what its bound call reads), the ``second`` values for them, and how to judge
    outputs computed from ``second`` (``instruments.timing.Fresh``). Use as a context manager around the timing:
    entering keeps the first values, leaving writes them back."""

    stage: Any
    buffers: tuple
    second: tuple
    deviation: Any = None
    _first: tuple | None = field(default=None, repr=False)

    def __enter__(self) -> Self:
        self._first = tuple(b.clone() if isinstance(b, torch.Tensor) else b for b in self.buffers)
        return self

    def __exit__(self, *exc) -> None:
        if self._first is not None:
            self._write(self._first)
        self._first = None

    def _write(self, values: tuple) -> None:
        with torch.no_grad():
            for buffer, value in zip(self.buffers, values, strict=True):
                if isinstance(buffer, torch.Tensor):
                    buffer.copy_(value)

    def refill(self, remaining: int) -> None:
        """The second values before the last call and every other one before it; the first values between."""
        if self._first is None:
            raise RuntimeError("FreshInputs.refill outside its context: the first values were not kept")
        self._write(self.second if remaining % 2 == 0 else self._first)

    def verify(self, outputs: object) -> str | None:
        """Why ``outputs`` are not the stage's outputs on the second values (by the stage's rule), or None."""
        expected = self.stage.spec.oracle(*self.second, **self.stage.params)
        verdict, detail, _ = judge(self.stage, self.deviation, outputs, expected, self.second)
        return None if verdict in (Verdict.PASS, Verdict.DEVIATES) else detail


def fresh_inputs(stages: Sequence, second: Mapping[str, Any],
                 impls: Mapping[str, Any] | None = None) -> list[FreshInputs | None]:  # fmt: skip
    """A ``FreshInputs`` per stage of ``stages`` (bound by ``build_step``: each ``run`` a ``BoundCall`` whose
    ``args`` are its input buffers), its second values taken from ``second`` (the step's tensors by name, run from
    inputs of the second seed); None for a stage whose call shows no buffers. ``impls``: stage name -> the
    implementation run there (its declared deviation is allowed)."""
    out = []
    for s in stages:
        buffers = getattr(s.run, "args", None)
        if buffers is None:
            out.append(None)
            continue
        impl = (impls or {}).get(s.name)
        out.append(FreshInputs(s, tuple(buffers), tuple(second[name] for name in s.inputs),
                               getattr(impl, "deviation", None)))  # fmt: skip
    return out
