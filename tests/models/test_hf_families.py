"""Importing the families of issue 15 (Mistral, Gemma 2 and 3, OLMo 2, gpt-oss,
Phi-3): every key that changes the maths mapped, the others named in one error."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from megakernel.errors import ConfigError, IRError, ShardingError
from megakernel.compiler.shard import shard_model
from megakernel.ir.config import build
from megakernel.ir.ops import Rope, RopeScaling
from megakernel.models.checkpoint import load_checkpoint
from megakernel.models.hf import from_hf
from megakernel.models.tensor_files import TensorFiles

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"


def config(family: str, **changes) -> dict:
    data = json.loads((FIXTURES / family / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not ...}


def test_mistral_windows_every_layer():
    card = from_hf(config("mistral"))
    assert card.sliding_window == 4 and card.layer_types is None
    assert (card.pre_norms, card.post_norms, card.tie_embeddings) == (True, False, False)


def test_gemma2_card():
    card = from_hf(config("gemma2"))
    assert card.layer_types == ("sliding_attention", "full_attention")
    assert (card.attn_logit_softcap, card.final_logit_softcap) == (5.0, 4.0)
    assert card.softmax_scale == pytest.approx(24 ** -0.5)
    assert card.norm_offset and card.pre_norms and card.post_norms and card.tie_embeddings
    assert card.activation == "gelu_tanh" and card.scale_embeddings
    model = build(card)
    assert model.embed_ops[0].factor == 8.0 and model.logit_ops[0].cap == 4.0
    names = [n.name for n in model.layers[0].nodes]
    assert names.index("post_attn_norm") < names.index("attn_residual")
    assert names.index("post_ffn_norm") < names.index("ffn_residual")


def test_gemma2_defaults_and_null_caps():
    # Without layer_types: sliding for even layers; a null cap switches it off;
    # an absent one is the class default (50 / 30).
    card = from_hf(config("gemma2", layer_types=None, num_hidden_layers=4,
                          attn_logit_softcapping=None, final_logit_softcapping=...))
    assert card.layer_types == ("sliding_attention", "full_attention") * 2
    assert card.attn_logit_softcap is None and card.final_logit_softcap == 30.0


def test_gemma_embedding_scale_is_rounded_to_the_dtype():
    # sqrt(3584) = 59.87 becomes 59.75 in bfloat16 (transformers casts it first).
    wide = config("gemma2", hidden_size=3584, head_dim=16, num_attention_heads=4)
    assert build(from_hf(wide)).embed_ops[0].factor == 59.75
    assert build(from_hf(wide, dtype="float32")).embed_ops[0].factor == pytest.approx(
        math.sqrt(3584), rel=1e-7)


def test_gemma3_rope_per_layer_type_in_both_forms():
    card = from_hf(config("gemma3_text"))
    assert (card.rope_theta, card.sliding_rope_theta) == (1e6, 1e4)
    assert card.rope_scaling.rope_type == "linear" and card.rope_scaling.factor == 8.0
    assert card.qk_norm and not card.qk_norm_all_heads and card.attn_logit_softcap is None
    old = config("gemma3_text", rope_parameters=..., layer_types=..., rope_theta=1e6,
                 rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert from_hf(old) == card          # 4.x keys; layer types from the pattern (6)
    model = build(card)
    local, full = model.layers[0], model.layers[5]
    assert local.node("q_rope").op.theta == 1e4 and local.node("q_rope").op.scaling is None
    assert full.node("q_rope").op.theta == 1e6 and full.node("q_rope").op.scaling.factor == 8
    assert local.node("attention").op.sliding_window == 4
    assert full.node("attention").op.sliding_window is None


def test_gemma3_ignores_attention_softcapping_and_refuses_bidirectional():
    assert from_hf(config("gemma3_text", attn_logit_softcapping=50.0)).attn_logit_softcap is None
    with pytest.raises(ConfigError, match="use_bidirectional_attention"):
        from_hf(config("gemma3_text", use_bidirectional_attention=True))


def test_olmo2_post_norms_and_norm_over_all_heads():
    card = from_hf(config("olmo2"))
    assert (card.pre_norms, card.post_norms, card.qk_norm_all_heads) == (False, True, True)
    layer = build(card).layers[0]
    assert layer.node("q_norm").op.dim == 64 and layer.node("k_norm").op.dim == 32
    assert layer.node("q_proj").inputs == ("x",)                # no input norm
    # The mean of squares of q is a partial sum over cores: all-reduced before q_norm.
    model = build(card)
    reductions = shard_model(model, 2).stacks[0].reductions
    assert {(r.producer, r.consumer) for r in reductions} >= {("q_ms", "q_norm"),
                                                              ("k_ms", "k_norm")}


def test_norm_over_all_heads_refuses_replicated_heads():
    model = build(from_hf(config("olmo2")))           # 2 KV heads: replicated on 4 cores
    with pytest.raises(ShardingError, match="k_ms.*count copies"):
        shard_model(model, 4)


def test_gpt_oss_card():
    card = from_hf(config("gpt_oss"))
    m = card.moe
    assert (m.num_experts, m.top_k, m.expert_intermediate) == (4, 2, 96)
    assert m.renormalize and m.router_logit_bias and m.expert_bias
    assert (m.swiglu_limit, m.swiglu_alpha) == (1.5, 1.702)
    assert card.attention_sinks and card.qkv_bias and card.o_bias
    s = card.rope_scaling
    assert (s.rope_type, s.factor, s.truncate, s.original_max_position) == ("yarn", 32, False, 4096)
    rope = build(card).layers[0].node("q_rope").op
    assert rope.attention_factor() == pytest.approx(0.1 * math.log(32) + 1)   # 1.3466
    with pytest.raises(ConfigError, match="experts_per_token: 3 differs"):
        from_hf(config("gpt_oss", experts_per_token=3))
    # OpenAI's mxfp4 loads (tests/models/test_shipped_native.py); a malformed one is named.
    with pytest.raises(ConfigError, match="quantization_config.modules_to_not_convert"):
        from_hf(config("gpt_oss", quantization_config={"quant_method": "mxfp4",
                                                       "modules_to_not_convert": "lm_head"}))


def test_yarn_matches_the_documented_deepseek_numbers():
    # tests/fixtures/hf/README.md: d = 8, theta 1e4, factor 40, beta 32/1, orig
    # 4096 -> frequencies 0, 1 unscaled, 2 half-blended, 3 divided by 40; with
    # mscale 1.0 and mscale_all_dim 0.8 the cos/sin factor is 1.05697.
    card = from_hf({"model_type": "llama", "vocab_size": 128, "hidden_size": 32,
                    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                    "rope_theta": 1e4, "rope_scaling": {
                        "rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                        "original_max_position_embeddings": 4096, "mscale": 1.0,
                        "mscale_all_dim": 0.8}})
    rope = Rope(1, 8, 1e4, scaling=card.rope_scaling)
    plain = Rope(1, 8, 1e4).inv_freq()
    ratio = rope.inv_freq() / plain
    np.testing.assert_allclose(ratio, [1, 1, (1 + 1 / 40) / 2, 1 / 40], rtol=1e-12)
    assert rope.attention_factor() == pytest.approx(1.05697, abs=1e-5)
    assert Rope(1, 8, 1e4, scaling=RopeScaling("linear", 2.0)).attention_factor() == 1.0


def test_phi3_partial_rotary_and_fused_projections():
    card = from_hf(config("phi3"))
    assert card.rotary_dim == 12 and card.tie_embeddings and card.sliding_window is None
    old = config("phi3", rope_parameters=..., rope_theta=1e4, partial_rotary_factor=0.75)
    assert from_hf(old) == card
    with pytest.raises(ConfigError, match="'longrope' is not supported"):
        from_hf(config("phi3", rope_parameters={"rope_type": "longrope", "factor": 2.0,
                                                "rope_theta": 1e4}))
    # The fused rows are split q | k | v and gate | up, and every row is used.
    weights = load_checkpoint(FIXTURES / "phi3")
    files = TensorFiles(FIXTURES / "phi3")
    qkv = files.get("model.layers.0.self_attn.qkv_proj.weight")
    got = np.concatenate([weights[f"layers.0.{p}_proj.weight"].T for p in "qkv"])
    np.testing.assert_array_equal(got, qkv)
    gate_up = files.get("model.layers.1.mlp.gate_up_proj.weight")
    got = np.concatenate([weights[f"layers.1.mlp.{p}"].T for p in ("gate", "up")])
    np.testing.assert_array_equal(got, gate_up)


def test_gpt_oss_experts_are_deinterleaved():
    weights = load_checkpoint(FIXTURES / "gpt_oss")
    files = TensorFiles(FIXTURES / "gpt_oss")
    gu = files.get("model.layers.1.mlp.experts.gate_up_proj")          # [E, D, 2I]
    np.testing.assert_array_equal(weights["layers.1.moe.experts_gate"], gu[..., 0::2])
    np.testing.assert_array_equal(weights["layers.1.moe.experts_up"], gu[..., 1::2])
    bias = files.get("model.layers.1.mlp.experts.gate_up_proj_bias")
    np.testing.assert_array_equal(weights["layers.1.moe.experts_up_bias"], bias[..., 1::2])


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3_text", "olmo2", "gpt_oss",
                                    "phi3"])
def test_unknown_keys_are_listed(family):
    with pytest.raises(ConfigError, match=r"foo_bar: 3 \(unknown key"):
        from_hf(config(family, foo_bar=3))


def test_gemma3_local_base_follows_the_sliding_layers():
    # Every layer sliding: each keeps the local base; every layer full: none has it.
    card = from_hf(config("gemma3_text", layer_types=["sliding_attention"] * 6))
    assert card.layer_types == ("sliding_attention",) * 6 and card.sliding_rope_theta == 1e4
    assert build(card).layers[5].node("q_rope").op.theta == 1e4
    card = from_hf(config("gemma3_text", layer_types=["full_attention"] * 6))
    assert card.layer_types is None and card.sliding_rope_theta is None
    with pytest.raises(IRError, match="sliding_rope_theta is set but layer_types names no"):
        dataclasses.replace(card, sliding_rope_theta=1e4)
