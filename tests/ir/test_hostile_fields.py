"""No value from a model file reaches a record unchecked: a string of code in any
field of any op kind, card, tensor, node or model is refused, by name."""

import enum
import json
from dataclasses import fields

import pytest

from megakernel.errors import IRError
from megakernel.ir.config import LinearAttentionConfig, MLAConfig, ModelConfig, MoEConfig, build
from megakernel.ir.graph import Layer, Model, OpNode
from megakernel.ir.ops import OP_KINDS, RMSNorm, RopeScaling
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.ir.types import TensorSpec
from megakernel.models import zoo
from megakernel.models.cards import card_from_json, card_to_dict

HOSTILE = "__import__('os').system('touch /tmp/megakernel-pwned') == 0"

# A valid instance of every op kind; a new kind must be added here.
VALID_OPS = {
    "rmsnorm": dict(dim=64),
    "linear": dict(in_features=64, out_features=32),
    "rope": dict(num_heads=2, head_dim=64, scaling={"rope_type": "linear", "factor": 2.0}),
    "attention": dict(num_q_heads=2, num_kv_heads=1, head_dim=64, sliding_window=8),
    "mlp": dict(hidden=64, intermediate=128),
    "moe": dict(hidden=64, num_experts=4, top_k=2, expert_intermediate=64),
    "add": dict(),
    "mul": dict(),
    "activation": dict(fn="tanh"),
    "scale": dict(factor=0.5),
    "softcap": dict(cap=30.0),
    "channel_scale": dict(dim=64),
    "mean_square": dict(dim=64),
    "rms_scale": dict(dim=64, offset=True),
    "mla": dict(num_heads=2, kv_lora_rank=32, nope_dim=16, rope_dim=8, v_head_dim=16,
                scaling={"rope_type": "yarn", "factor": 4.0}, output_gate=True),
    "gated_deltanet": dict(num_key_heads=2, num_value_heads=4, key_dim=16, value_dim=16),
    "residual_gate": dict(dim=64, temperature=0.3),
    "expert_combine": dict(hidden=128, top_k=2, norm_eps=1e-8, norm_input_scaled=True,
                           norm_offset=True),
}


def test_every_op_kind_has_a_valid_example():
    assert set(VALID_OPS) == set(OP_KINDS)
    for kind, kwargs in VALID_OPS.items():
        OP_KINDS[kind](**kwargs)


@pytest.mark.parametrize("kind, field", [(k, f.name) for k, c in OP_KINDS.items()
                                         for f in fields(c)])
def test_a_string_of_code_in_any_op_field_is_refused(kind, field):
    with pytest.raises(IRError) as info:
        OP_KINDS[kind](**{**VALID_OPS[kind], field: HOSTILE})
    assert field in str(info.value)


@pytest.mark.parametrize("field", [f.name for f in fields(RopeScaling)])
def test_a_string_of_code_in_rope_scaling_is_refused(field):
    valid = dict(rope_type="llama3", factor=8.0)
    with pytest.raises(IRError, match=field):
        RopeScaling(**{**valid, field: HOSTILE})


def _values(obj):
    return [getattr(obj, f.name) for f in fields(obj)]


def test_valid_records_hold_only_checked_python_values():
    """Every field of every op of every zoo model is a bool, int, finite float,
    enum, identifier string, None or a checked nested record."""
    allowed = (bool, int, float, enum.Enum, type(None), RopeScaling)
    for name in zoo.names():
        model = zoo.model(name)
        for layer in {layer for layer in model.layers}:
            for n in layer.nodes:
                assert all(isinstance(v, allowed) for v in _values(n.op)), (name, n.op)
        assert isinstance(model.tie_embeddings, bool)
        assert all(isinstance(v, (bool, int, float)) for v in _values(model.final_norm))


def _card():
    c = card_to_dict(zoo.card("tiny-moe"))
    c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position": 64}
    c["sliding_window"] = 64
    # a hybrid card, so the linear-attention fields are read too
    c["layer_types"] = ["linear_attention", "full_attention", "full_attention"]
    c["linear_attention"] = {"num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 64,
                             "value_head_dim": 64, "conv_kernel": 4}
    return c


def _gqa_card():
    """_card() without its linear-attention layers: every layer takes the
    card's default mixer (MLA, where the card has an mla block)."""
    c = _card()
    del c["layer_types"], c["linear_attention"]
    return c


CARD_FIELDS = ([f.name for f in fields(ModelConfig)]
               + [f"moe.{f.name}" for f in fields(MoEConfig)]
               + [f"linear_attention.{f.name}" for f in fields(LinearAttentionConfig)]
               + [f"rope_scaling.{f.name}" for f in fields(RopeScaling)])


@pytest.mark.parametrize("field", CARD_FIELDS)
def test_a_string_of_code_in_any_card_field_is_refused(field):
    card = _card()
    *outer, leaf = field.split(".")
    (card[outer[0]] if outer else card)[leaf] = HOSTILE
    with pytest.raises(IRError) as info:
        build(card_from_json(json.dumps(card)))
    assert leaf in str(info.value)


def _ir_paths(doc):
    """(path, leaf) of every op field, final_norm field and top-level scalar."""
    out = [((k,), k) for k in ("name", "vocab_size", "hidden_size", "dtype",
                               "tie_embeddings", "max_seq_len")]
    out += [(("final_norm", k), k) for k in doc["final_norm"] if k != "kind"]
    for i, layer in enumerate(doc["layer_defs"]):
        out += [(("layer_defs", i, k), k) for k in ("kind", "input", "output")]
        for j, node in enumerate(layer["nodes"]):
            out += [(("layer_defs", i, "nodes", j, "op", k), k) for k in node["op"]]
            out += [(("layer_defs", i, "nodes", j, k), k) for k in ("name", "inputs", "outputs")]
        for j, _ in enumerate(layer["tensors"]):
            out += [(("layer_defs", i, "tensors", j, k), k) for k in ("name", "shape", "dtype")]
    return out


def _qwen_like():
    card = _card()
    card.update(qkv_bias=True, qk_norm=True, norm_offset=True)
    return build(card_from_json(json.dumps(card)))


IR_DOC = json.loads(model_to_json(_qwen_like()))


@pytest.mark.parametrize("path, leaf", _ir_paths(IR_DOC), ids=lambda p: str(p))
def test_a_string_of_code_anywhere_in_an_ir_file_is_refused(path, leaf):
    doc = json.loads(json.dumps(IR_DOC))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = HOSTILE
    with pytest.raises(IRError) as info:
        model_from_json(json.dumps(doc))
    assert leaf in str(info.value)


def test_records_built_in_python_check_their_fields():
    norm = RMSNorm(64)
    with pytest.raises(IRError, match="name"):
        TensorSpec("class", (4,))
    with pytest.raises(IRError, match="offset"):
        RMSNorm(64, 1e-6, "no")
    with pytest.raises(IRError, match="inputs"):
        OpNode("n", norm, ("x\n",), ("y",))
    layer = zoo.model("tiny-dense").layers[0]
    with pytest.raises(IRError, match="kind"):
        Layer("import", layer.nodes, layer.tensors)
    with pytest.raises(IRError, match="tie_embeddings"):
        Model("m", 256, 256, (layer,), norm, HOSTILE)


MLA_BLOCK = {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
             "v_head_dim": 16, "q_lora_rank": 32}


@pytest.mark.parametrize("field", [f.name for f in fields(MLAConfig)])
def test_a_string_of_code_in_the_mla_block_is_refused(field):
    card = {**_gqa_card(), "mla": {**MLA_BLOCK, field: HOSTILE}}
    with pytest.raises(IRError) as info:
        build(card_from_json(json.dumps(card)))
    assert field in str(info.value)


def test_an_mla_card_ir_file_refuses_code_in_every_mla_field():
    card = {**_gqa_card(), "mla": MLA_BLOCK, "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            "sliding_window": None}
    doc = json.loads(model_to_json(build(card_from_json(json.dumps(card)))))
    paths = [p for p in _ir_paths(doc) if "op" in p[0] and p[0][-1] != "kind"]
    mla = [p for p in paths if doc["layer_defs"][p[0][1]]["nodes"][p[0][3]]["op"]["kind"]
           == "mla"]
    assert {leaf for _, leaf in mla} >= {"kv_lora_rank", "rope_dim", "scaling", "output_gate"}
    for path, leaf in mla:
        bad = json.loads(json.dumps(doc))
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = HOSTILE
        with pytest.raises(IRError) as info:
            model_from_json(json.dumps(bad))
        assert leaf in str(info.value)
