"""The gate's rules and their defaults, in one place: what ``compare_runs`` applies, what ``compare --help`` and the
README say, and what ``--threshold`` / ``--floor-us`` set. No heavy imports: ``mxbench --help`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_DELTAS = {"gemm": 0.03, "end_to_end": 0.03, "quantize": 0.03, "rearrange": 0.07, "pad": 0.07}
DEFAULT_FLOOR_US = 0.25
"""The bands and floor, from A/A spread (docs/perf-log.md, "The regression gate's bands"): in the H200's A/A regress
(results/baselines/nvidia-h200-aa.txt) no quantizer's 95% CI strayed more than 0.5% from 1 (a 7% band let a certain
5% regression through: 3% now), rearranges (3-5 us) up to 3.1% and 0.1 us, GEMMs up to 8.7% and end to end 13%
(UNSURE there, never SLOWER: SLOWER needs the whole CI past the band). The largest A/A change of a kernel under
10 us was 0.1 us: a 0.25 us floor (1 us hid a 20% regression of a 4 us kernel)."""
VERDICTS = ("SLOWER", "UNSURE", "SAME", "FASTER", "MODEL")
"""The verdicts, worst first; MODEL: neither side was measured (analytic model runs), so no interval exists."""
MIN_SAMPLES = 3
"""Fewer measured samples than this on either side cannot bound a ratio: the verdict is UNSURE."""
CLOCK_RULE_CATEGORIES = ("gemm",)
"""Stages whose time follows the SM clock (compute-bound): only their change in time is read in cycles. A
memory-bound kernel's time follows the memory clock, so an SM clock drop does not excuse its slowdown."""

RULES = (
    "Per stage, the ratio r = median(new) / median(base) of the stored samples gets a bootstrap 95% CI (each side "
    "resampled on its own). SLOWER: the CI lies above 1 + delta (the stage category's band) and the medians differ "
    "by more than the floor (--floor-us); FASTER mirrors it; SAME: the CI lies within 1 +- delta, or any change it "
    "allows is under the floor; UNSURE otherwise, and when either side has fewer than {min} samples. For GEMMs "
    "(compute-bound), a SLOWER or FASTER that the SM clock explains (CI x clock ratio back within the band) is "
    "UNSURE. Runs without samples (the model) compare as MODEL: no interval, no verdict. BROKEN: the stage ran in "
    "base and only errors in new (its error shown). IMPOSSIBLE: new timed the stage below its roofline floor (its "
    "declared bytes over the card's datasheet bandwidth, FLOPs over its peak): never compared, and it fails the "
    "gate as BROKEN does. Bands (--threshold CATEGORY=PCT): {bands}."
)


def rules_text(deltas: Mapping[str, float] = DEFAULT_DELTAS, floor_us: float = DEFAULT_FLOOR_US) -> str:
    """The gate's rules in words, with the bands and floor given (``compare --help``, docs/ci.md)."""
    bands = ", ".join(f"{c} {d * 100:g}%" for c, d in deltas.items())
    return RULES.format(min=MIN_SAMPLES, bands=f"{bands}; floor {floor_us:g} us")
