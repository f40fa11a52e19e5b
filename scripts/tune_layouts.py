"""Tune the launch configs of the scale-rearrange and token-padding kernels on a CUDA GPU.

    python scripts/tune_layouts.py [--budget-s 170] [--samples 10]

For each kernel at DeepSeek-V3 shapes (G = 8) and each candidate config passed explicitly (block sizes, warps),
the output is first checked bit-exact against the plain-torch reference, then timed with
``mxbench.instruments.timing.time_fn`` (cold-L2 CUDA-graph replays). One line per (kernel, case, config): median us, IQR,
TB/s over the module's ``*_cost`` (bytes read + whole output written), and the fraction of a plain device copy's
TB/s measured first on the same card. Then the best config per case, and per kernel the config with the least
total time over its cases. A config that fails (compile error, wrong bytes, timing error) is reported and skipped;
configs left when the time budget runs out are listed as skipped. All numbers go to ``$OUT/tune_layouts.json``
when ``$OUT`` is set.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch
import triton
from mxkernels.layouts import scale_layout
from mxkernels.layouts import padding

from mxbench.instruments.timing import time_fn
from tuning import start

G = 8
M = 131072


@dataclass
class Case:
    """One kernel at one shape: ``run(**config)`` launches it with the launch config built from the dict ``config``
    (the module's ``RearrangeConfig`` or ``PadConfig``), ``expected`` is the reference output."""

    kernel: str
    label: str
    run: object
    expected: torch.Tensor
    cost: object
    configs: list[dict] = field(default_factory=list)


def group_ends(total: int, skewed: bool, multiple: int = 1, seed: int = 0) -> torch.Tensor:
    """int32 (G,) ends on the GPU: equal groups, or skewed unaligned ones (one holds ~60%, one is empty)."""
    units = total // multiple
    if skewed:
        rng = random.Random(seed)
        weights = [0.6] + [rng.uniform(0.2, 1.0) for _ in range(G - 1)]
        weights[3] = 0.0
        scale = 0.4 / sum(weights[1:])
        sizes = [int(units * 0.6)] + [int(units * w * scale) for w in weights[1:]]
    else:
        sizes = [units // G] * G
    sizes[-1] += units - sum(sizes)
    ends = torch.tensor(sizes).cumsum(0) * multiple
    return ends.to(torch.int32).cuda()


def scale_bytes(*shape: int) -> torch.Tensor:
    """Random nonzero e8m0 scales on the GPU."""
    return torch.randint(1, 256, shape, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)


def grid(**axes) -> list[dict]:
    """Every combination of the given option lists, as config dicts."""
    configs = [{}]
    for name, options in axes.items():
        configs = [{**c, name: o} for c in configs for o in options]
    return configs


def rearrange_cases():
    """Yields one case at a time so that only one case's tensors live on the GPU."""
    for C in (224, 64):
        s = scale_bytes(M, C)
        offs = group_ends(M, skewed=False)
        cols = [b for b in (32, 64, 128, 256) if b // 2 < C]
        yield Case(
            "rearrange_m_groups", f"({M}, {C})",
            lambda s=s, offs=offs, **k: scale_layout.rearrange_m_groups(s, offs, config=scale_layout.RearrangeConfig(**k)),
            scale_layout.rearrange_m_groups_reference(s, offs), scale_layout.rearrange_m_groups_cost(M, C, G),
            grid(block_cols=cols, num_warps=[4, 8]),
        )  # fmt: skip
    for shape in ((G, 2048, 224), (G, 7168, 64)):
        s = scale_bytes(*shape)
        cols = [b for b in (32, 64, 128, 256) if b // 2 < shape[2]]
        yield Case(
            "rearrange_3d", str(shape), lambda s=s, **k: scale_layout.rearrange_3d(s, config=scale_layout.RearrangeConfig(**k)),
            scale_layout.rearrange_3d_reference(s), scale_layout.rearrange_3d_cost(*shape), grid(block_cols=cols, num_warps=[2, 4, 8]),
        )  # fmt: skip
    for R, order in ((2048, "col"), (7168, "col"), (7168, "row")):
        s = scale_bytes(R, M // 32)
        if order == "col":
            s = s.t().contiguous().t()  # as wgrad's dim1 quantizer produces them
        offs = group_ends(M, skewed=False, multiple=32)
        yield Case(
            "rearrange_k_groups", f"({R}, {M // 32}) {order}-major",
            lambda s=s, offs=offs, **k: scale_layout.rearrange_k_groups(s, offs, config=scale_layout.RearrangeConfig(**k)),
            scale_layout.rearrange_k_groups_reference(s, offs), scale_layout.rearrange_k_groups_cost(R, M, G),
            grid(block_cols=[32, 64, 128], num_warps=[4, 8]),
        )  # fmt: skip


def pad_configs(D: int) -> list[dict]:
    """(block_rows, block_cols in elements, num_warps), block_cols capped at the padded row width, deduplicated."""
    width = triton.next_power_of_2(D)
    raw = [(16, 1024, 4), (32, 1024, 8), (8, 2048, 8), (4, 4096, 8), (16, 512, 4), (2, 8192, 8)]
    seen, configs = set(), []
    for rows, cols, warps in raw:
        key = (rows, min(cols, width), warps)
        if key not in seen:
            seen.add(key)
            configs.append(dict(zip(("block_rows", "block_cols", "num_warps"), key)))
    return configs


def pad_cases(pad_shapes):
    """Yields one case at a time (the 7168-wide ones hold ~4 GB)."""
    for D, alignment, skewed in pad_shapes:
        x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
        offs = group_ends(M, skewed=skewed, seed=D + alignment)
        sizes = torch.diff(offs, prepend=offs.new_zeros(1)).tolist()
        padded, padded_offs = padding.pad_token_groups_reference(x, offs, alignment)
        label = f"({M}, {D}) a={alignment} {'skewed' if skewed else 'balanced'}"
        yield Case(
            "pad_token_groups", label,
            lambda x=x, offs=offs, a=alignment, **k: padding.pad_token_groups(
                x, offs, a, config=padding.PadConfig(**k)
            )[0],
            padded, padding.pad_cost(M, D, G, alignment, 2, sizes), pad_configs(D),
        )  # fmt: skip
        yield Case(
            "unpad_token_groups", label,
            lambda p=padded, o=offs, po=padded_offs, **k: padding.unpad_token_groups(
                p, o, po, M, config=padding.PadConfig(**k)
            ),
            x, padding.unpad_cost(M, D, G, alignment, 2, sizes), pad_configs(D),
        )  # fmt: skip


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


def measure(case: Case, config: dict, samples: int) -> dict:
    row = {"kernel": case.kernel, "case": case.label, "config": config, "bytes": case.cost.bytes}
    try:
        out = case.run(**config)
        torch.cuda.synchronize()
        if out.shape != case.expected.shape or not torch.equal(bits(out), bits(case.expected)):
            raise AssertionError("output differs from the reference")
        del out
        t = time_fn(lambda: case.run(**config), samples=samples, target_replay_ms=5.0)
        row.update(us=t.median_us, iqr_us=t.iqr_us, tbps=case.cost.bytes / t.median_us / 1e6, ok=True)
    except Exception as e:  # noqa: BLE001 (a failing config is reported and skipped)
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        traceback.print_exc(limit=1, file=sys.stderr)
    torch.cuda.empty_cache()
    return row


def fmt_config(config: dict) -> str:
    return " ".join(f"{k.replace('block_', 'b').replace('num_warps', 'w')}={v}" for k, v in config.items())


def summarize(rows: list[dict]) -> dict:
    """Best config per (kernel, case), and per kernel the config with the least total time over all its cases."""
    best_case, totals, counts, cases = {}, {}, {}, {}
    for r in rows:
        if not r.get("ok"):
            continue
        key = (r["kernel"], r["case"])
        if key not in best_case or r["us"] < best_case[key]["us"]:
            best_case[key] = r
        cfg = json.dumps(r["config"], sort_keys=True)
        totals[(r["kernel"], cfg)] = totals.get((r["kernel"], cfg), 0.0) + r["us"]
        counts[(r["kernel"], cfg)] = counts.get((r["kernel"], cfg), 0) + 1
        cases.setdefault(r["kernel"], set()).add(r["case"])
    best_kernel = {}
    for (kernel, cfg), total in totals.items():
        if counts[(kernel, cfg)] == len(cases[kernel]) and (
            kernel not in best_kernel or total < best_kernel[kernel]["total_us"]
        ):
            best_kernel[kernel] = {"config": json.loads(cfg), "total_us": total}
    return {
        "best_per_case": [
            {"kernel": k, "case": c, "config": r["config"], "us": r["us"], "tbps": r["tbps"]}
            for (k, c), r in best_case.items()
        ],
        "best_per_kernel": best_kernel,
    }


def main() -> None:
    only_help = "comma-separated kernel names to tune (default: all)"
    session = start("tune_layouts", __doc__.split("\n\n")[0], "", only_help, M, 7168)
    args, t0, roof = session.args, session.t0, session.roof
    print(f"copy kernel bf16 (131072 x 7168): {roof:.2f} TB/s (read + write) = the roof below", flush=True)

    # Most important first: a run cut short by the budget still has the DeepSeek-V3 headline cases.
    pad_shapes = [(7168, 32, False), (7168, 32, True), (2048, 32, False), (2048, 128, True),
                  (7168, 128, False), (2048, 32, True), (7168, 128, True), (2048, 128, False)]  # fmt: skip
    builders = [rearrange_cases, lambda: pad_cases(pad_shapes)]
    only = set(filter(None, args.only.split(",")))
    rows, skipped = [], []
    for build in builders:
        for case in build():
            if only and case.kernel not in only:
                continue
            for config in case.configs:
                if time.monotonic() - t0 > args.budget_s:
                    skipped.append({"kernel": case.kernel, "case": case.label, "config": config})
                    continue
                r = measure(case, config, args.samples)
                rows.append(r)
                status = (f"{r['us']:9.2f} us +-{r['iqr_us']:6.2f}  {r['tbps']:5.2f} TB/s  {r['tbps'] / roof:4.0%} of copy"
                          if r["ok"] else f"FAILED {r['error']}")  # fmt: skip
                print(f"[{time.monotonic() - t0:5.0f}s] {case.kernel:20s} {case.label:34s} {fmt_config(config):28s} "
                      f"{status}", flush=True)  # fmt: skip
            case = None  # free its tensors before the next case is built
            torch.cuda.empty_cache()

    summary = summarize(rows)
    print("\nbest per case:")
    for b in summary["best_per_case"]:
        print(f"  {b['kernel']:20s} {b['case']:34s} {fmt_config(b['config']):28s} {b['us']:9.2f} us "
              f"{b['tbps']:5.2f} TB/s {b['tbps'] / roof:4.0%} of copy")  # fmt: skip
    print("best per kernel (least total time over its cases):")
    for kernel, b in summary["best_per_kernel"].items():
        print(f"  {kernel:20s} {fmt_config(b['config']):28s} total {b['total_us']:.1f} us")
    session.finish("tune_layouts", rows, skipped, summary, timing={"target_replay_ms": 5.0})


if __name__ == "__main__":
    main()
