"""The latent MoE and Muse Spark's router options in the IR (issue 34 item 1):
the card's fields refused by name when they do not fit together, the layer
each form builds (node by node, weight by weight), the size formula against
the built params, and the JSON round trips of card and graph."""

import dataclasses
import json

import pytest

from megakernel.errors import IRError
from megakernel.ir import sizes
from megakernel.ir.config import MoEConfig, build
from megakernel.ir.kind_expert_combine import ExpertCombine
from megakernel.ir.ops import MoE
from megakernel.ir.serialize import model_from_json, model_to_json
from megakernel.ir.types import DType
from megakernel.models.cards import card_from_json
from tests.latent_moe_cards import KIMI, MUSE, in_dtype


def _moe(**kw):
    return MoEConfig(8, 2, 256, **kw)


@pytest.mark.parametrize("fields, named, says", [
    (dict(expert_output_norm="rms"), "expert_output_norm",
     "expert_output_norm='rms', expected one of ['none', 'per_expert', 'weighted_sum']"),
    (dict(expert_output_norm_eps=1e-8), "expert_output_norm_eps",
     "expert_output_norm_eps=1e-08 with expert_output_norm='none'"),
    (dict(expert_output_norm_input_scaled=True), "expert_output_norm_input_scaled",
     "with expert_output_norm='none'"),
    (dict(expert_output_norm="weighted_sum", expert_output_norm_input_scaled=True),
     "expert_output_norm_input_scaled", "built for per_expert only"),
    (dict(latent_input_norm=True), "latent_input_norm", "with latent_size=0"),
    (dict(latent_size=128, num_shared_experts=1, shared_intermediate=128,
          shared_expert_gate=True), "shared_expert_gate", "latent_size=128"),
    (dict(renormalize=False, renormalize_eps=1e-15), "renormalize_eps",
     "renormalize_eps=1e-15 with renormalize=false"),
])
def test_card_fields_that_do_not_fit_together_are_refused_by_name(fields, named, says):
    with pytest.raises(IRError) as info:
        _moe(**fields)
    assert info.value.path == named and says in info.value.message, str(info.value)
    assert info.value.hint, "the error says what to change"
    # read from a card file, the path leads to the field
    card = {**MUSE.to_dict(), "moe": {**dataclasses.asdict(_moe()), **fields}}
    with pytest.raises(IRError) as info:
        card_from_json(json.dumps(card))
    assert f"moe.{named}" in info.value.path, str(info.value)


@pytest.mark.parametrize("fields, named", [
    (dict(router_logit_scale=0.0), "router_logit_scale"),
    (dict(renormalize_eps=0.5), "renormalize_eps"),
    (dict(expert_output_norm="per_expert", expert_output_norm_eps=0.0), "norm_eps"),
])
def test_out_of_range_values_are_refused_by_the_op_naming_the_layer(fields, named):
    card = dataclasses.replace(MUSE, moe=dataclasses.replace(MUSE.moe, **fields))
    with pytest.raises(IRError) as info:
        build(card)
    # the per-expert norm's eps is the combine node's, its hint the card field
    node = "expert_combine" if named == "norm_eps" else "moe"
    assert info.value.path == f"layers.0.{node}" and named in info.value.message, str(info.value)
    assert named != "norm_eps" or "expert_output_norm_eps" in info.value.hint


def test_the_op_refuses_what_its_card_block_never_builds():
    with pytest.raises(IRError, match="num_shared_experts=1 with router_dim=256"):
        MoE(128, 8, 2, 256, num_shared_experts=1, shared_intermediate=128, router_dim=256)
    with pytest.raises(IRError, match="renormalize_eps=1e-15 with renormalize=False"):
        MoE(128, 8, 2, 256, renormalize_eps=1e-15)
    with pytest.raises(IRError, match="no norm to scale"):
        MoE(128, 8, 2, 256, expert_output_norm_input_scaled=True)


def test_a_latent_op_takes_the_routers_input_second():
    op = MoE(128, 8, 2, 256, router_dim=256, router_f32=True, expert_output_norm=True)
    assert op.infer(((128,), (256,))) == ((128,),)
    for wrong in (((128,),), ((256,), (128,)), ((128,), (256,), (256,))):
        with pytest.raises(IRError, match="per-token shapes"):
            op.infer(wrong)
    p = op.params(DType.BF16)
    assert (p["router"].shape, p["router"].dtype) == ((256, 8), DType.F32)
    assert (p["experts_gate"].shape, p["experts_down"].shape) == ((8, 128, 256), (8, 256, 128))
    assert p["expert_output_norm"].shape == (128,) and p["expert_output_norm"].dtype == DType.BF16
    assert MoE(128, 8, 2, 256).infer(((128,),)) == ((128,),)


def _ffn(model):
    layer = model.layers[-1]
    names = [n.name for n in layer.nodes]
    return {n.name: n for n in layer.nodes[names.index("post_norm") + 1:-1]}


def test_muse_sparks_form_is_a_latent_block_with_picks_normed_by_the_combine():
    model = build(MUSE)
    ffn = _ffn(model)
    assert list(ffn) == ["pre_expert_proj", "pre_expert_norm", "moe", "expert_combine",
                         "post_expert_proj"]
    op = ffn["moe"].op
    assert ffn["moe"].inputs == ("x_latent_normed", "h_ffn")
    assert ffn["moe"].outputs == ("slots", "slot_weights")
    assert (op.hidden, op.router_dim, op.router_f32, op.router_logit_scale) == (
        128, 256, True, 2 ** -2.5)
    assert (op.per_slot, op.expert_output_norm, op.renormalize_eps) == (True, False, 1e-15)
    assert op.infer(((128,), (256,))) == ((2 * 128,), (2,))
    comb = ffn["expert_combine"]
    assert comb.inputs == ("slots", "slot_weights") and comb.outputs == ("routed",)
    assert (comb.op.hidden, comb.op.top_k, comb.op.norm, comb.op.norm_eps,
            comb.op.norm_input_scaled, comb.op.norm_offset) == (128, 2, True, 1e-8, True, True)
    norm = ffn["pre_expert_norm"].op
    assert (norm.dim, norm.eps, norm.offset) == (128, MUSE.norm_eps, True)
    params = model.layers[-1].params(model.dtype)
    assert params["pre_expert_proj.weight"].shape == (256, 128)
    assert params["post_expert_proj.weight"].shape == (128, 256)
    assert params["expert_combine.weight"].shape == (128,)
    # both projections read whole tensors and ask for a split of their rows;
    # a plain Linear's JSON leaves the field out (earlier graphs, same digests)
    assert ffn["pre_expert_proj"].op.split_rows and ffn["post_expert_proj"].op.split_rows
    assert "split_rows" not in model.layers[-1].node("q_proj").op.to_dict()
    assert model_from_json(model_to_json(model)) == model


def test_the_per_slot_forms_refuse_what_they_cannot_mean():
    with pytest.raises(IRError, match="per_slot") as info:
        MoE(128, 8, 2, 256, per_slot=True, expert_output_norm=True)
    assert "expert_output_norm=False" in info.value.message
    with pytest.raises(IRError, match="norm_offset=True with norm=False"):
        ExpertCombine(128, 2, norm=False, norm_offset=True)
    with pytest.raises(IRError, match="per-token shapes"):
        ExpertCombine(128, 2).infer(((128,), (2,)))


def test_kimi_k3s_form_norms_the_sum_and_adds_full_width_shared_experts():
    model = build(KIMI)
    ffn = _ffn(model)
    assert list(ffn) == ["pre_expert_proj", "moe", "expert_output_norm", "post_expert_proj",
                         "shared_experts", "shared_add"]
    assert ffn["moe"].op.num_shared_experts == 0 and not ffn["moe"].op.expert_output_norm
    norm = ffn["expert_output_norm"].op
    assert (norm.dim, norm.eps, norm.offset) == (128, KIMI.norm_eps, False)
    shared = ffn["shared_experts"]
    assert shared.inputs == ("h_ffn",) and (shared.op.hidden, shared.op.intermediate) == (256, 256)
    assert ffn["shared_add"].inputs == ("routed_out", "shared")
    assert model.layers[0].kind.endswith("dense")


def test_a_plain_moe_card_builds_the_one_op_as_before():
    card = dataclasses.replace(KIMI, moe=dataclasses.replace(
        KIMI.moe, latent_size=0, expert_output_norm="none"))
    ffn = _ffn(build(card))
    assert list(ffn) == ["moe"] and ffn["moe"].op.num_shared_experts == 2
    # a weighted-sum norm without projections: the shared experts still come after it
    card = dataclasses.replace(card, moe=dataclasses.replace(
        card.moe, expert_output_norm="weighted_sum"))
    assert list(_ffn(build(card))) == ["moe", "expert_output_norm", "shared_experts",
                                       "shared_add"]


@pytest.mark.parametrize("card", [MUSE, KIMI, in_dtype(MUSE, "bfloat16"),
                                  in_dtype(KIMI, "bfloat16")], ids=lambda c: c.name + c.dtype)
def test_the_size_formula_is_the_built_params_and_the_json_round_trips(card):
    model = build(card)
    assert sizes.of_config(card) == sizes.of_model(model)
    assert model_from_json(model_to_json(model)) == model
    assert card_from_json(json.dumps(card.to_dict())) == card
