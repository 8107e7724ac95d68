"""Random valid cards build and round-trip; random invalid ones fail by name."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from megakernel.errors import IRError
from megakernel.ir.config import ModelConfig, build
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.testing import model_configs, replace


@settings(max_examples=60)
@given(model_configs())
def test_valid_cards_build_and_round_trip(config):
    model = build(config)
    assert len(model.layers) == config.num_layers
    # stacks (periodic ones too) cover every layer once, in order
    assert [i for s in model.stacks for i in s.indices] == list(range(config.num_layers))
    assert model_from_json(model_to_json(model)) == model
    assert ModelConfig.from_dict(config.to_dict()) == config


@settings(max_examples=30)
@given(model_configs(moe=True, max_layers=4))
def test_stacks_follow_layer_kinds(config):
    assume(config.layer_types is None)          # one mixer: stacks follow the FFN kinds
    model = build(config)
    kinds = [s.kind for s in model.stacks]
    expected = (["dense"] if config.first_k_dense else []) + ["moe"]
    assert kinds == expected
    assert model.stacks[-1].count == config.num_layers - config.first_k_dense


# (change to a valid card, path that must be named, field that must be named)
BAD_CHANGES = [
    (dict(num_kv_heads=3), "layers.0.attention", "num_q_heads"),
    (dict(head_dim=0), "layers.0.q_proj", "out_features"),
    (dict(norm_eps=-1.0), "layers.0.input_norm", "eps"),
    (dict(rotary_dim=3), "layers.0.q_rope", "rotary_dim"),
    (dict(rope_theta=0.5), "layers.", "theta"),     # the first layer using rope_theta
    (dict(sliding_window=0), "layers.0.attention", "sliding_window"),
    (dict(activation="relu6"), "layers.0.mlp", "activation"),
    (dict(dtype="int3"), "config", "dtype"),
    (dict(num_layers=0), "config", "num_layers"),
    (dict(softmax_scale=-1.0), "layers.0.attention", "softmax_scale"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 4.0}), "config.rope_scaling",
     "rope_type"),
]
BAD_MOE_CHANGES = [
    (dict(moe__top_k=99), "moe", "top_k"),
    (dict(moe__scoring="argmax"), "moe", "scoring"),
    (dict(moe__routed_scaling=0.0), "moe", "routed_scaling"),
    (dict(moe__num_shared_experts=1, moe__shared_intermediate=0), "moe", "shared_intermediate"),
]


@settings(max_examples=40)
@given(model_configs(moe=False), st.sampled_from(BAD_CHANGES))
def test_invalid_cards_name_layer_and_field(config, bad):
    changes, path, field = bad
    assume(config.pre_norms or path != "layers.0.input_norm")   # post-norm-only: no input_norm
    types = config.layer_types or ("full_attention",) * config.num_layers
    if "rotary_dim" in changes:     # a NoPE first layer has no q_rope to name
        assume(types[0] not in config.nope_layer_types)
    if "rope_theta" in changes:     # sliding layers may use sliding_rope_theta instead
        assume(config.sliding_rope_theta is None or "full_attention" in config.layer_types)
        assume("full_attention" not in config.nope_layer_types)     # NoPE reads no theta
    with pytest.raises(IRError) as info:
        build(replace(config, **changes))
    assert info.value.path.startswith(path), str(info.value)
    assert field in str(info.value)


@settings(max_examples=20)
@given(model_configs(moe=True), st.sampled_from(BAD_MOE_CHANGES))
def test_invalid_moe_cards_name_layer_and_field(config, bad):
    changes, op, field = bad
    with pytest.raises(IRError) as info:
        build(replace(config, **changes))
    first_moe = config.first_k_dense
    assert info.value.path == f"layers.{first_moe}.{op}", str(info.value)
    assert field in str(info.value)


def test_error_message_reads_like_the_docs():
    config = ModelConfig("m", 256, 28 * 64, 4, 28, 6, 64, 256)
    with pytest.raises(IRError, match=r"^layers\.0\.attention: num_q_heads=28 is not a "
                                      r"multiple of num_kv_heads=6"):
        build(config)


@pytest.mark.parametrize("text, path", [
    ("[]", ""),
    ('{"format": "megakernel.ir/9"}', "format"),
    ("{not json", ""),
])
def test_malformed_ir_json_is_an_ir_error(text, path):
    with pytest.raises(IRError) as info:
        model_from_json(text)
    assert info.value.path == path


def test_ir_json_with_unknown_op_field_is_named():
    import json

    model = build(ModelConfig("m", 256, 128, 1, 2, 1, 64, 256))
    data = json.loads(model_to_json(model))
    data["layer_defs"][0]["nodes"][1]["op"]["colour"] = "blue"
    with pytest.raises(IRError, match=r"layer_defs\.0\.q_proj\.linear: unknown fields \['colour'\]"):
        model_from_json(json.dumps(data))
