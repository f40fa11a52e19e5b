"""``table --kind map``: a map run's speedups, one table per recipe (a row per G, a column per token value), then
bf16's forward + backward time at every cell; a model run says so in its heading and its header block."""

from __future__ import annotations

from collections.abc import Sequence

from ...storage.results import Run
from ...views.render import MODEL_MARK, Row, header_block, render
from .axes import Scope
from .speedups import BreakEven, MapView, map_view


def speedup_text(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}x"


def _rows(view: MapView, matrix: list[list[float | None]], text) -> list[Row]:
    g = view.grid
    corner = f"G \\ {g.axis.title}"
    return [{corner: str(G), **{str(v): text(x) for v, x in zip(g.values, row, strict=True)}}
            for G, row in zip(g.experts, matrix, strict=True)]  # fmt: skip


def break_even_text(value: BreakEven, values: tuple[int, ...]) -> str:
    if value.below:
        return f"<= {values[0]}"
    if value.above:
        return f"> {values[-1]}"
    return "unknown" if value.at is None else f"~{value.at:.0f}"


def _break_even_line(view: MapView, recipe: str, fmt: str) -> str:
    """One line under a recipe's table: where each row reaches 1.0x (``speedups.crossing``)."""
    g = view.grid
    cells = "; ".join(f"G={G}: {break_even_text(b, g.values)}"
                      for G, b in zip(g.experts, view.break_even(recipe), strict=True))  # fmt: skip
    line = f"1.0x reached at ({g.axis.title}, log-interpolated): {cells}"
    return f"# {line}\n" if fmt == "csv" else f"\n{line}\n"


def _heading(title: str, fmt: str) -> str:
    if fmt == "csv":
        return f"# {title}\n"
    return f"\n**{title}**\n\n" if fmt in ("markdown", "github") else f"\n{title}\n"


def map_table(run: Run, fmt: str = "markdown", recipes: Sequence[str] | None = None, header: bool = True) -> str:
    """The module doc's tables of ``run`` in ``fmt``; ``recipes`` picks some of its recipes."""
    view = map_view(run)
    g = view.grid
    kind = "measured" if view.measured else MODEL_MARK
    layer = g.scope is Scope.LAYER
    what = f"{g.label} {g.scope.value} (K={g.K}, N={g.N}"
    what += f", top-{g.model.top_k}, shared experts {g.model.shared})" if layer else ")"
    parts = [header_block(run, None, fmt)] if header and fmt != "csv" else []
    for recipe in [r for r in view.recipes if recipes is None or r in recipes]:
        parts.append(_heading(f"{g.recipe_label(recipe)} forward + backward speedup over bf16, {what}: {kind}", fmt))
        parts.append(render(_rows(view, view.matrix(recipe), speedup_text), fmt))
        parts.append(_break_even_line(view, recipe, fmt))
    parts.append(_heading(f"bf16 forward + backward (ms), {what}: {kind}", fmt))
    parts.append(render(_rows(view, view.bf16_matrix(), lambda us: None if us is None else f"{us / 1e3:.3f}"), fmt))
    return "".join(parts)
