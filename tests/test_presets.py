"""Shape presets (shapes/*.toml): every model the suite names, each value with its published source."""

from pathlib import Path

import pytest

from mxbench.plan.presets import SHAPES_DIR, get_preset, load_presets

NAMES = {
    "deepseek-v3", "kimi-k2", "llama4-scout", "llama4-maverick", "qwen3-235b-a22b", "qwen3-30b-a3b",
    "gpt-oss-120b", "mixtral-8x7b", "deepseek-v2-lite",
}  # fmt: skip

# (K, N, routed experts, experts per token), read from each model's config.json on its Hugging Face page.
PUBLISHED = {
    "deepseek-v3": (7168, 2048, 256, 8),
    "kimi-k2": (7168, 2048, 384, 8),
    "llama4-scout": (5120, 8192, 16, 1),
    "llama4-maverick": (5120, 8192, 128, 1),
    "qwen3-235b-a22b": (4096, 1536, 128, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "gpt-oss-120b": (2880, 2880, 128, 4),
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "deepseek-v2-lite": (2048, 1408, 64, 6),
}


def test_every_named_preset_is_present_and_nothing_else():
    assert set(load_presets()) == NAMES


@pytest.mark.parametrize("name", sorted(NAMES))
def test_preset_values_match_the_published_config(name):
    p = get_preset(name)
    assert (p.K, p.N, p.experts, p.top_k) == PUBLISHED[name]
    assert p.K % 32 == 0 and p.N % 32 == 0
    assert 1 <= p.G <= p.experts


@pytest.mark.parametrize("name", sorted(NAMES))
def test_preset_names_its_source_and_config_keys(name):
    p = get_preset(name)
    assert p.source.startswith("https://huggingface.co/") and p.source.endswith("/config.json")
    assert p.model in p.source
    assert set(p.keys) == {"K", "N", "experts", "top_k"} and all(p.keys.values())
    assert p.G_reason


# The fine-grained models' layers, from each config.json: (experts per token, shared experts, router scores) --
# num_experts_per_tok; n_shared_experts (none in Qwen3-MoE's or gpt-oss's config); scoring_func ("sigmoid" in
# Kimi K2's, none in Qwen3's or gpt-oss's, whose routers take a softmax), and the experts the layer holds at most.
FINE_GRAINED_LAYERS = {
    "qwen3-30b-a3b": (8, 0, "softmax", 128),
    "qwen3-235b-a22b": (8, 0, "softmax", 128),
    "gpt-oss-120b": (4, 0, "softmax", 128),
    "kimi-k2": (8, 1, "sigmoid", 384),
    "deepseek-v2-lite": (6, 2, "softmax", 64),
}


@pytest.mark.parametrize("name", sorted(FINE_GRAINED_LAYERS))
def test_fine_grained_presets_have_their_layer_with_its_reason(name):
    layer = get_preset(name).layer
    top_k, shared, score_func, experts = FINE_GRAINED_LAYERS[name]
    assert layer is not None and (layer.top_k, layer.shared_experts, layer.score_func) == (top_k, shared, score_func)
    assert top_k <= layer.experts <= experts and layer.tokens >= 1 and layer.reason


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ValueError, match="unknown preset 'nope'") as e:
        get_preset("nope")
    assert all(name in str(e.value) for name in NAMES)


def test_the_checkouts_shapes_folder_is_the_package_data():
    assert (Path(__file__).resolve().parents[1] / "shapes").resolve() == SHAPES_DIR and SHAPES_DIR.is_dir()


GOOD = """
name = "toy"
model = "org/toy"
source = "https://huggingface.co/org/toy/blob/main/config.json"
[K]
value = {K}
key = "hidden_size"
[N]
value = 64
key = "moe_intermediate_size"
[experts]
value = 8
key = "num_experts"
[top_k]
value = 2
key = "num_experts_per_tok"
[G]
value = 8
reason = "all local"
"""


def test_a_preset_file_parses(tmp_path):
    (tmp_path / "toy.toml").write_text(GOOD.format(K=128))
    assert get_preset("toy", tmp_path).K == 128


@pytest.mark.parametrize(
    "filename, text, match",
    [
        ("toy.toml", GOOD.format(K=100), "K must be a positive multiple of 32"),
        ("other.toml", GOOD.format(K=128), "differs from the file name"),
        ("toy.toml", GOOD.format(K=128).replace('key = "hidden_size"', ""), "not a valid shape preset"),
        ("toy.toml", "name = [", "not a valid shape preset"),
    ],
)
def test_a_bad_preset_file_is_named_in_the_error(tmp_path, filename, text, match):
    (tmp_path / filename).write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        load_presets(tmp_path)
    assert filename in str(e.value)
