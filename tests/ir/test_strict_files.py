"""Cards and IR files are checked strictly: exact types, finite numbers in range,
known keys, no duplicates, bounded nesting and size; sizes before building."""

import json
import time

import pytest
from hypothesis import given, settings

from megakernel.compiler.pipeline import plan_model
from megakernel.errors import IRError, PlanningError
from megakernel.ir import limits, sizes
from megakernel.ir.config import build
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.models import zoo
from megakernel.models.cards import card_from_json, card_to_dict
from megakernel.testing import model_configs


def card(**changes):
    c = card_to_dict(zoo.card("tiny-moe"))
    for key, value in changes.items():
        if "__" in key:
            outer, inner = key.split("__")
            c[outer] = {**c[outer], inner: value}
        else:
            c[key] = value
    return c


def load_card(c):
    return build(card_from_json(json.dumps(c)))


# (change, text the error must contain)
BAD_CARDS = [
    (dict(qkv_bias="false"), "config.qkv_bias: expected true or false, found 'false'"),
    (dict(qk_norm="false"), "config.qk_norm"),
    (dict(tie_embeddings="no"), "config.tie_embeddings"),
    (dict(hidden_size=256.5), "config.hidden_size: expected an integer"),
    (dict(hidden_size="256"), "config.hidden_size: expected an integer"),
    (dict(rope_theta=float("inf")), "rope_theta: expected a finite number"),
    (dict(softmax_scale=float("inf")), "softmax_scale: expected a finite number"),
    (dict(softmax_scale=float("nan")), "softmax_scale: expected a finite number"),
    (dict(moe__routed_scaling=float("inf")), "config.moe.routed_scaling: expected a finite"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": float("inf")}),
     "config.rope_scaling.factor: expected a finite number"),
    (dict(norm_eps=1e-300), "eps: expected a value >= 1e-12"),
    (dict(first_k_dense=3), "config.first_k_dense: first_k_dense=3 leaves no MoE layer"),
    (dict(name="tiny\n"), "config.name"),
    (dict(name="class"), "config.name"),
    (dict(name="x" * 200), "at most 128 characters"),
    (dict(name=7), "config.name: expected a string"),
    (dict(name=["a"]), "config.name: expected a string"),
    (dict(moe=[1, 2]), "config.moe: expected an object"),
    (dict(moe__top_k="2"), "config.moe.top_k: expected an integer"),
    (dict(hidden_size=10**12), "config.hidden_size: expected a value <= 1048576"),
    (dict(vocab_size=2**40), "config.vocab_size: expected a value <= 4194304"),
    (dict(num_layers=10**7), "config.num_layers: expected a value <= 1024"),
    (dict(colour="blue", shade=2), "unknown fields ['colour', 'shade']"),
    # The size formula of the mla mixer (ir/kind_mla.py) names the missing block
    # (was a KeyError from ir/sizes.py's table of mixers).
    (dict(layer_types=["mla"] * 3), "mla: the mixer is 'mla' but the card has no mla block"),
]


@pytest.mark.parametrize("change, expected", BAD_CARDS, ids=lambda c: str(c)[:40])
def test_bad_cards_are_named_errors(change, expected):
    t0 = time.perf_counter()
    with pytest.raises(IRError) as info:
        load_card(card(**change))
    assert expected in str(info.value)
    assert time.perf_counter() - t0 < 2


def ir_doc(name="tiny-moe"):
    return json.loads(model_to_json(zoo.model(name)))


def test_ir_strings_are_not_booleans():
    for path, leaf, value in ((("final_norm",), "offset", "false"),
                              (("layer_defs", 0, "nodes", 1, "op"), "bias", "false"),
                              (("layer_defs", 0, "nodes", 10, "op"), "gated", "no")):
        doc = ir_doc()
        target = doc
        for key in path:
            target = target[key]
        assert leaf in target, (path, target)
        target[leaf] = value
        with pytest.raises(IRError, match=f"{leaf}: expected true or false"):
            model_from_json(json.dumps(doc))


def test_ir_unknown_top_level_field_op_as_string_and_keyword_names():
    doc = ir_doc()
    doc["comment"] = "hi"
    with pytest.raises(IRError, match=r"unknown fields \['comment'\]"):
        model_from_json(json.dumps(doc))
    doc = ir_doc()
    doc["layer_defs"][0]["nodes"][0]["op"] = "rmsnorm"
    with pytest.raises(IRError, match=r"layer_defs\.0\.nodes\.0\.op: expected an object, found .rmsnorm."):
        model_from_json(json.dumps(doc))
    for where in ("name", "outputs"):
        doc = ir_doc()
        node = doc["layer_defs"][0]["nodes"][0]
        node[where] = "import" if where == "name" else ["class"]
        with pytest.raises(IRError, match=f"nodes.0.{where}"):
            model_from_json(json.dumps(doc))


def test_duplicate_keys_and_deep_nesting_and_huge_strings():
    text = json.dumps(card()).replace('"hidden_size": 256', '"hidden_size": 256, "hidden_size": 512')
    with pytest.raises(IRError, match=r"keys \['hidden_size'\] appear more than once"):
        card_from_json(text)
    deep = '{"format": "megakernel.card/1", "moe": ' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(IRError, match="nested deeper"):
        card_from_json(deep)
    deeper = json.dumps(card(moe=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]))
    with pytest.raises(IRError, match=r"moe\.0\.0.*nested more than 32"):
        card_from_json(deeper)
    t0 = time.perf_counter()
    with pytest.raises(IRError, match="at most 128 characters"):
        load_card(card(name="x" * 2_000_000))
    with pytest.raises(IRError, match="model files are limited"):
        card_from_json(json.dumps(card(name="x" * 20_000_000)))
    assert time.perf_counter() - t0 < 2


@settings(max_examples=25)
@given(model_configs())
def test_sizes_from_numbers_equal_sizes_from_the_graph(config):
    assert sizes.of_config(config) == sizes.of_model(build(config))


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_sizes_agree(name):
    assert sizes.of_config(zoo.card(name)) == sizes.of_model(zoo.model(name))


def test_a_model_too_big_for_any_topology_is_refused_with_figures():
    t0 = time.perf_counter()
    big = card(num_layers=1024, hidden_size=2**16, intermediate_size=2**18, first_k_dense=0,
               moe=None)
    with pytest.raises(IRError) as info:
        load_card(big)
    assert time.perf_counter() - t0 < 2
    text = str(info.value)
    assert text.startswith("config: tiny-moe has ") and "GB of weights" in text
    assert "capacity 103.0 GB (tpu7x, 32 TensorCore(s)" in text


def test_ir_file_too_big_is_refused_before_the_model_is_assembled():
    doc = ir_doc()
    doc["vocab_size"] = limits.MAX_VOCAB
    doc["layers"] = [1] * limits.MAX_LAYERS
    for t in doc["layer_defs"][1]["tensors"]:
        t["shape"] = [s * 4096 if s == 256 else s for s in t["shape"]]
    with pytest.raises(IRError):
        model_from_json(json.dumps(doc))


def test_planning_refuses_a_model_that_cannot_fit_its_cores_before_tiling():
    model = zoo.model("qwen3-32b")
    t0 = time.perf_counter()
    with pytest.raises(PlanningError, match=r"plan\.hbm: qwen3-32b has 65\.5 GB of weights"):
        plan_model(model, devices=1, batch=64)
    assert time.perf_counter() - t0 < 2
