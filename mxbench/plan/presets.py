"""Shape presets: a model's MoE dimensions, read from ``shapes/<name>.toml`` with the config.json key and source
of every number."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from mxkernels.core.errors import InputError

from .points import check_shape

# Package data, so a wheel has them; the checkout's top-level shapes/ is a link to this folder.
SHAPES_DIR = Path(__file__).resolve().parents[1] / "data" / "shapes"


@dataclass(frozen=True)
class Preset:
    """A model's MoE shapes: K = model dim, N = expert hidden dim, and a default G (local experts).

    ``keys`` maps each field to the config.json key it was read from, at ``source``.
    """

    name: str
    model: str
    source: str
    K: int
    N: int
    experts: int
    top_k: int
    G: int
    G_reason: str
    keys: dict[str, str]
    layer: LayerPreset | None = None


@dataclass(frozen=True)
class LayerPreset:
    """The single-GPU MoE layer of ``mxbench layer --preset``: its tokens, experts (local to one GPU), top-k,
    shared experts and score function, with the reason (whose benchmark or which config these are)."""

    tokens: int
    experts: int
    top_k: int
    shared_experts: int
    score_func: str
    reason: str


PRESET_FIELDS = ("K", "N", "experts", "top_k")


def _read_preset(path: Path) -> Preset:
    try:
        d = tomllib.loads(path.read_text())
        values = {f: int(d[f]["value"]) for f in (*PRESET_FIELDS, "G")}
        keys = {f: str(d[f]["key"]) for f in PRESET_FIELDS}
        layer = d.get("layer")
        if layer is not None:
            layer = LayerPreset(int(layer["tokens"]), int(layer["experts"]), int(layer["top_k"]),
                                int(layer["shared_experts"]), str(layer["score_func"]), str(layer["reason"]))
        preset = Preset(d["name"], d["model"], d["source"], G_reason=str(d["G"]["reason"]), keys=keys, layer=layer,
                        **values)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: not a valid shape preset ({type(e).__name__}: {e})") from None
    if preset.name != path.stem:
        raise InputError(f"{path}: name {preset.name!r} differs from the file name")
    try:
        check_shape(preset.N, preset.K, preset.G)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    return preset


def load_presets(directory: Path = SHAPES_DIR) -> dict[str, Preset]:
    """Every ``<name>.toml`` in ``directory`` (``SHAPES_DIR``: the installed presets, or the checkout's), by name."""
    return {p.stem: _read_preset(p) for p in sorted(Path(directory).glob("*.toml"))}


def get_preset(name: str, directory: Path = SHAPES_DIR) -> Preset:
    presets = load_presets(directory)
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; valid presets: {', '.join(presets) or '(none found)'}")
    return presets[name]
