"""Muse Spark's options as IR: the ops they add (parameter-free RMSNorm, the
(1 + w) channel scale, the residual gate) are checked when built and read
back from JSON; the card fields build the graph Muse Spark's layer is, in its
order, and each refuses what it cannot mean by name."""

import dataclasses
import json

import pytest

from megakernel.errors import IRError
from megakernel.ir import sizes
from megakernel.ir.config import MLAConfig, build
from megakernel.ir.kind_elementwise import ChannelScale, Scale, Softcap
from megakernel.ir.kind_residual_gate import ResidualGate
from megakernel.ir.ops import RMSNorm, op_from_dict
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.ir.types import DType
from megakernel.models.cards import card_from_json, card_to_dict
from tests.muse_like import MUSE_LIKE, muse_like


def test_a_parameter_free_norm_has_no_weight_and_no_offset():
    assert RMSNorm(64, weight=False).params(DType.BF16) == {}
    assert set(RMSNorm(64).params(DType.BF16)) == {"weight"}
    with pytest.raises(IRError, match="offset=True scales by"):
        RMSNorm(64, 1e-6, True, False)


def test_the_residual_gate_checks_its_fields_and_shapes():
    gate = ResidualGate(64, 0.3)
    assert gate.floor == 1e-3 and gate.params(DType.BF16)["gate"].dtype == DType.F32
    assert gate.infer(((64,), (64,))) == ((64,),)
    for bad in (0.0, -0.3):
        with pytest.raises(IRError, match="temperature"):
            ResidualGate(64, bad)
    with pytest.raises(IRError, match="floor"):
        ResidualGate(64, 0.3, 1.5)
    with pytest.raises(IRError, match="residual and branch"):
        gate.infer(((64,), (32,)))


@pytest.mark.parametrize("op", [RMSNorm(64, 1e-8, weight=False), ChannelScale(64, True),
                                ResidualGate(64, 0.3, 1e-2)])
def test_the_new_ops_read_back_from_their_dicts(op):
    assert op_from_dict(json.loads(json.dumps(op.to_dict()))) == op


def _nodes(layer):
    return [(n.name, n.op.kind) for n in layer.nodes]


def test_the_card_builds_muse_sparks_layer_in_its_order():
    model = build(MUSE_LIKE)
    sliding, full = model.layers
    names = [n for n, _ in _nodes(sliding)]
    # the output: per-head norm, then the gate, then o_proj; then the post norm
    assert names[names.index("attention"):names.index("attn_residual") + 1] == [
        "attention", "o_norm", "gate_act", "attn_gate", "o_proj", "post_attn_norm",
        "attn_residual"]
    assert names[-4:] == ["mlp", "post_ffn_norm", "post_ffn_rms", "ffn_residual"]
    # NoPE full-attention layers: no rotation; the sliding ones rotate
    assert {"q_rope", "k_rope"} <= set(names)
    assert not {"q_rope", "k_rope"} & {n for n, _ in _nodes(full)}
    ops = {n.name: n.op for n in sliding.nodes}
    assert ops["q_norm"] == RMSNorm(64, 1e-5, weight=False) == ops["k_norm"] == ops["o_norm"]
    assert ops["post_attn_norm"] == RMSNorm(256, 1e-8, weight=False)
    assert ops["post_ffn_norm"] == ChannelScale(256, True)
    assert ops["post_ffn_rms"] == RMSNorm(256, 1e-8, weight=False)
    assert ops["input_norm"] == RMSNorm(256, 1e-5, True) == ops["post_norm"]
    assert ops["attn_residual"] == ResidualGate(256, 0.3) == ops["ffn_residual"]
    assert ops["attention"].softmax_scale == pytest.approx(5.4730064863875 / 8)
    assert model.embed_ops == (RMSNorm(256, 1e-5, weight=False),)
    assert model.logit_ops == (Scale(2 ** -2.5), Softcap(20.0))
    assert model.vocab_used == 500
    params = set(sliding.params(DType.F32))
    assert {"attn_residual.gate", "ffn_residual.gate", "post_ffn_norm.weight"} <= params
    assert not any(p.startswith(("q_norm", "k_norm", "o_norm", "post_attn_norm"))
                   for p in params)


def test_the_model_and_the_card_round_trip_through_json():
    model = build(MUSE_LIKE)
    assert model_from_json(model_to_json(model)) == model
    assert card_from_json(json.dumps(card_to_dict(MUSE_LIKE))) == MUSE_LIKE


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sizes_from_the_card_equal_those_of_the_graph(dtype):
    """The gates are f32 whatever the dtype; parameter-free norms weigh nothing."""
    card = muse_like(dtype=dtype)
    assert sizes.of_config(card) == sizes.of_model(build(card))


def test_without_the_options_the_layer_is_as_before():
    plain = build(muse_like(qk_norm_weight=True, attn_output_norm=False, post_norm_eps=None,
                            post_attn_norm_weight=True, post_ffn_norm_input_scaled=False,
                            residual_gate_temperature=None, embed_norm=False,
                            nope_layer_types=(), final_logit_scale=1.0, vocab_used=None))
    assert all(n.op.kind != "residual_gate" for n in plain.layers[1].nodes)
    assert "k_rope" in dict(_nodes(plain.layers[1]))
    assert plain.embed_ops == () and plain.logit_ops == (Softcap(20.0),)


@pytest.mark.parametrize("changes, field, words", [
    (dict(qk_norm=False), "qk_norm_weight", "qk_norm is not set"),
    (dict(qk_norm_all_heads=True), "qk_norm_weight", "per head only"),
    (dict(post_norms=False), "post_norm_eps", "post_norms is not"),
    (dict(post_norms=False, post_norm_eps=None), "post_attn_norm_weight", "post_norms is not"),
    (dict(post_norms=False, post_norm_eps=None, post_attn_norm_weight=True),
     "post_ffn_norm_input_scaled", "post_norms is not"),
    (dict(final_logit_scale=0.0), "final_logit_scale", "must be in"),
    (dict(final_logit_scale=-1.0), "final_logit_scale", "must be in"),
    (dict(vocab_used=513), "vocab_used", "exceeds vocab_size=512"),
    (dict(nope_layer_types=("linear_attention",)), "nope_layer_types", "not a mixer with"),
    (dict(nope_layer_types=("sliding", )), "nope_layer_types", "not a mixer with"),
    (dict(layer_types=None, sliding_window=None, nope_layer_types=("sliding_attention",)),
     "nope_layer_types", "no layer is one"),
    (dict(nope_layer_types=("full_attention",) * 2), "nope_layer_types", "twice"),
])
def test_each_option_refuses_what_it_cannot_mean_by_name(changes, field, words):
    with pytest.raises(IRError, match=words) as info:
        muse_like(**changes)
    assert info.value.path.endswith(field)


def test_the_final_norm_offset_follows_norm_offset_unless_set():
    assert build(MUSE_LIKE).final_norm.offset is True          # None: as norm_offset
    assert build(muse_like(final_norm_offset=False)).final_norm.offset is False
    plain = muse_like(norm_offset=False)
    assert build(plain).final_norm.offset is False
    assert build(dataclasses.replace(plain, final_norm_offset=True)).final_norm.offset is True
    # the block norms keep norm_offset: only the final norm changes
    layers = build(muse_like(final_norm_offset=False)).layers
    assert layers[0].node("input_norm").op.offset is True


def test_a_final_norm_offset_that_is_not_a_bool_is_named():
    data = {**card_to_dict(MUSE_LIKE), "final_norm_offset": "no"}
    with pytest.raises(IRError) as info:
        card_from_json(json.dumps(data))
    assert "final_norm_offset" in str(info.value)


def test_a_bad_temperature_names_the_card_field():
    with pytest.raises(IRError, match="residual_gate_temperature"):
        build(muse_like(residual_gate_temperature=0.0))


def test_mla_layers_refuse_the_attention_output_norm():
    card = muse_like(layer_types=None, sliding_window=None, nope_layer_types=(),
                     qk_norm=False, qk_norm_weight=True, attn_output_gate=False,
                     mla=MLAConfig(32, 16, 8, 16))
    with pytest.raises(IRError, match="attn_output_norm=True does not apply to MLA"):
        build(card)
