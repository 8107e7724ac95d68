"""Hugging Face muse_spark (models/hf_muse.py): the text model of Muse Spark's
multimodal checkpoint imports to a card of general options, its tensors load
(the towers ignored, the NVFP4 experts as their shipped codes), and the
reference reproduces transformers' own logits (tests/fixtures/hf/README.md,
"Muse Spark (issue 34)")."""

import copy
import dataclasses
import json

import numpy as np
import pytest

from megakernel import quantize
from megakernel.errors import ConfigError
from megakernel.ir.config import build
from megakernel.models import zoo
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from tests.models.test_hf_fixtures import FIXTURES, _matches_hf_logits

CONFIG = json.loads((FIXTURES / "muse_spark" / "config.json").read_text())
# The weights HF keeps in float32 (_keep_in_fp32_modules_strict), so does the IR.
F32 = ("attn_residual.gate", "ffn_residual.gate", "moe.router", "moe.router_bias")


def _config(**text):
    out = copy.deepcopy(CONFIG)
    out["text_config"].update(text)
    out["text_config"] = {k: v for k, v in out["text_config"].items() if v is not None}
    return out


def test_the_fixture_config_imports_to_muse_sparks_options():
    card = from_hf(FIXTURES / "muse_spark")
    assert (card.norm_offset, card.final_norm_offset) == (True, False)   # (1 + w), final plain w
    assert card.layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert card.nope_layer_types == ("full_attention",) and card.sliding_window == 4
    assert card.softmax_scale == pytest.approx(5.4730064863875 / 4.0)
    assert (card.final_logit_scale, card.final_logit_softcap) == (2.0, 4.0)
    assert card.moe.router_logit_scale == 2.0 and card.moe.latent_size == 32
    assert card.residual_gate_temperature == 0.3 and card.post_norm_eps == 1e-8
    assert card.vocab_used is None          # HF has no used-vocab field


def test_the_public_sizes_import_to_the_zoo_card():
    """The fixture's config at the public sizes and values (the README's), its
    layer lists left to HF's defaults for 62 layers, is the zoo card, but for
    vocab_used (Inferact's count of trained rows: no HF field); the caches
    sized for the zoo's 4096-token serving context."""
    public = _config(vocab_size=202048, hidden_size=8192, num_hidden_layers=62,
                     num_attention_heads=128, num_key_value_heads=16, head_dim=64,
                     intermediate_size=16384, moe_hidden_size=4096, moe_intermediate_size=4096,
                     num_local_experts=256, num_experts_per_tok=8, sliding_window=2048,
                     output_multiplier=2 ** -2.5, final_logit_softcapping=20.0,
                     layer_types=None, layer_rope_theta=None, mlp_layer_types=None,
                     max_position_embeddings=None)
    card = from_hf(public, name="muse-spark", max_seq_len=4096)
    assert card == dataclasses.replace(zoo.card("muse-spark"), vocab_used=None)
    assert [i for i, t in enumerate(card.layer_types) if t == "full_attention"] == list(
        range(1, 62, 4))                    # every 4th from the last


@pytest.mark.parametrize("text, key, words", [
    (dict(layer_rope_theta=[5e5, 0, 5e5, 0]), "layer_rope_theta", "some sliding_attention"),
    (dict(mlp_layer_types=["sparse", "dense", "sparse", "sparse"]), "mlp_layer_types",
     "all-sparse"),
    (dict(num_shared_experts=1), "num_shared_experts", "no shared expert"),
    (dict(attention_bias=True), "attention_bias", "not supported"),
    (dict(layer_types=["sliding_attention"] * 3), "layer_types", "should list 4"),
])
def test_what_the_card_cannot_hold_is_named(text, key, words):
    with pytest.raises(ConfigError, match=words) as info:
        from_hf(_config(**text))
    assert key in str(info.value)


def test_absent_keys_take_hfs_defaults():
    """A config without final_logit_softcapping is capped at HF's 20; without
    layer_rope_theta the NoPE layers are HF's every 4th from the last, whatever
    layer_types says: a full layer moved elsewhere leaves a NoPE sliding layer,
    which the card cannot hold, and is named."""
    assert from_hf(_config(final_logit_softcapping=None)).final_logit_softcap == 20.0
    card = from_hf(_config(layer_rope_theta=None))
    assert card.nope_layer_types == ("full_attention",)
    moved = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    with pytest.raises(ConfigError, match="0 for some sliding_attention layers only"):
        from_hf(_config(layer_types=moved, layer_rope_theta=None))


def test_the_lm_head_is_never_tied():
    # transformers ties only the weights a class declares; this one declares none
    assert from_hf(_config(tie_word_embeddings=True)).tie_embeddings is False


def test_a_top_level_key_that_contradicts_the_text_config_is_named():
    with pytest.raises(ConfigError, match="tie_word_embeddings=True differs"):
        from_hf({**CONFIG, "tie_word_embeddings": True})


@pytest.mark.parametrize("family", ["muse_spark", "muse_spark_nvfp4"])
def test_the_text_model_loads_and_the_towers_are_ignored(family):
    model = build(from_hf(FIXTURES / family))
    weights = load_checkpoint(FIXTURES / family, model)
    assert list(weights) == list(model.params())
    for name, w in weights.items():
        if isinstance(w, quantize.Packed):
            continue
        want = "float32" if name.endswith(F32) else "bfloat16"
        assert str(w.dtype) == want, name


def test_the_nvfp4_experts_load_as_their_shipped_codes():
    card = from_hf(FIXTURES / "muse_spark_nvfp4")
    assert card.quantize.chosen() == {"experts": "nvfp4"}
    weights = load_checkpoint(FIXTURES / "muse_spark_nvfp4", build(card))
    packed = {k for k, v in weights.items() if isinstance(v, quantize.Packed)}
    assert packed == {f"layers.{i}.moe.experts_{p}" for i in (0, 1)
                      for p in ("gate", "up", "down")}
    gate = weights["layers.0.moe.experts_gate"]
    assert gate.codes.shape == (8, 64, 128) and len(np.unique(gate.codes)) == 16


# Measured (f32 reference vs transformers' f32 eager): at most 2.3e-5 absolute
# (muse_spark decode 1; logits up to 3.7) and 1.4e-5 (muse_spark_nvfp4 decode 2),
# within _matches_hf_logits' 1e-4. Muse Spark's attention is sharp (unit-RMS q
# and k times 5.47 / sqrt(hd)): float32 rounding alone moves HF's own logits by
# a few 1e-5 (README: float32 vs float64 3.5e-5).
@pytest.mark.parametrize("family", ["muse_spark", "muse_spark_nvfp4"])
def test_reference_matches_hf_logits(family):
    _matches_hf_logits(FIXTURES / family)
