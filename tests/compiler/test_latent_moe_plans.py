"""Plans of the latent MoE (tests/latent_moe_cards.py): how each form is split
over cores, where the all-reduces sit, which splits a per-expert norm leaves
the planner, and the cost model's expert phase at the latent width."""

import dataclasses

import pytest

from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.plan import Plan
from megakernel.compiler.request import Overrides
from megakernel.compiler.shard import legal_core_counts, shard_model
from megakernel.errors import ShardingError
from megakernel.ir.config import build
from tests.latent_moe_cards import KIMI, MUSE


def _moe(card, **fields):
    return dataclasses.replace(card, moe=dataclasses.replace(card.moe, **fields))


def _sites(plan):
    return {(r.tensor, r.producer, r.consumer) for r in plan.shard.stacks[-1].reductions}


def _roles(plan):
    return {p.name: (p.shape, p.dtype, p.role) for p in plan.shard.stacks[-1].params}


def test_muse_keeps_every_expert_whole_and_reduces_the_latent_sum():
    plan = plan_model(build(MUSE), devices=2, batch=2, tokens=1)
    assert plan.shard.stacks[-1].experts == (("moe", 2, 1, 4, 256),)
    assert dict(plan.choices)["moe_parallel"].startswith("ep=2 (expert_output_norm")
    # The projections are ordinary linears reading replicated tensors: replicated
    # weights (no split feeds them); the latent sum is all-reduced before the up
    # projection, at the latent width, and nothing after it.
    assert ("routed", "moe", "post_expert_proj") in _sites(plan)
    roles = _roles(plan)
    assert roles["pre_expert_proj.weight"] == ((256, 128), "float32", "replicated")
    assert roles["post_expert_proj.weight"] == ((128, 256), "float32", "replicated")
    assert roles["moe.expert_output_norm"][2] == "replicated"
    bf16 = plan_model(build(dataclasses.replace(MUSE, dtype="bfloat16")), devices=1, batch=1,
                      tokens=1)
    assert _roles(bf16)["moe.router"] == ((256, 8), "float32", "replicated")   # router_f32


def test_kimi_norms_the_reduced_sum_and_adds_the_full_width_shared_experts():
    plan = plan_model(build(KIMI), devices=2, batch=2, tokens=1)
    sites = _sites(plan)
    assert {("routed", "moe", "expert_output_norm"), ("shared", "shared_experts", "shared_add")
            } <= sites
    assert not any(s[1] == "post_expert_proj" for s in sites)
    roles = _roles(plan)
    assert roles["shared_experts.gate"][2] == "columns of intermediate"
    assert roles["moe.experts_gate"][2].startswith("experts over")
    assert plan.shard.stacks[-1].experts[0][1:3] in ((1, 2), (2, 1))


def test_a_per_expert_norm_refuses_a_split_of_the_expert_width():
    model = build(MUSE)
    assert shard_model(model, 2).ep == 2          # the default: the one legal split
    for forced in ("tp", 1):
        with pytest.raises(ShardingError) as info:
            plan_model(model, devices=2, batch=1, tokens=1,
                       overrides=Overrides(moe_parallel=forced))
        assert "expert_output_norm" in info.value.message and "ep must be cores=2" in str(
            info.value), str(info.value)
    # with 6 experts, 4 cores would split them: not a legal core count here,
    # though it is without the per-expert norm
    six = build(_moe(MUSE, num_experts=6))
    plain = build(_moe(MUSE, num_experts=6, expert_output_norm="none",
                       expert_output_norm_eps=None, expert_output_norm_input_scaled=False))
    assert 4 not in legal_core_counts(six) and 4 in legal_core_counts(plain)
    with pytest.raises(ShardingError, match="num_experts=\\[6\\]"):
        shard_model(six, 4)


@pytest.mark.parametrize("card", [MUSE, KIMI], ids=["muse", "kimi"])
def test_the_expert_phase_streams_and_multiplies_at_the_latent_width(card):
    latent = plan_model(build(card), devices=1, batch=2, tokens=1)
    full = plan_model(build(_moe(card, latent_size=0, latent_input_norm=False)), devices=1,
                      batch=2, tokens=1)
    (e,), (f,) = latent.memory.experts, full.memory.experts
    assert (e.hidden, f.hidden) == (128, 256)
    assert e.chunk_dma_bytes == 3 * 128 * e.chunk * 4
    phase = {p.name: p for p in latent.cost.phases}["s0.moe" if card is MUSE else "s1.moe"]
    router = 256 * 8 * 4
    assert phase.hbm_bytes == e.bytes_per_layer + router
    assert e.bytes_per_layer * 2 == f.bytes_per_layer     # half the width, half the bytes


def test_a_latent_plan_round_trips_and_a_plain_one_writes_no_new_fields():
    plan = plan_model(build(MUSE), devices=2, batch=1, tokens=1)
    text = plan.to_json()
    back = Plan.from_json(text)
    assert back.digest() == plan.digest() and back.memory == plan.memory
    (g,) = [og.geometry for og in plan.memory.geometries if og.library == "moe"]
    assert (g.expert_output_norm, g.expert_output_norm_input_scaled, g.renormalize_eps) == (
        True, True, 1e-15)
    # the geometry of a MoE without the new options writes none of their fields,
    # so earlier plans keep their JSON and digests
    plain = plan_model(build(_moe(KIMI, latent_size=0, expert_output_norm="none")), devices=1,
                       batch=1, tokens=1)
    (g,) = [og for og in plain.to_dict()["memory"]["geometries"] if og["library"] == "moe"]
    assert not {"router_logit_scale", "expert_output_norm"} & set(g["geometry"])


def test_the_full_size_muse_spark_card_plans_on_8_cores_with_nvfp4_experts():
    """The zoo card (bf16, 1,640 GB of weights) needs more HBM than 8 TensorCores
    hold, and says what to change; with its routed experts in NVFP4 (the vendor's
    format, and Inferact's 8-core plan) it plans. Only that it plans is asserted
    here: how the experts split is the planner's to choose."""
    from megakernel.errors import PlanningError
    from megakernel.ir.weight_kinds import Quantize
    from megakernel.models import zoo

    card = zoo.card("muse-spark")
    with pytest.raises(PlanningError, match="HBM per core") as info:
        plan_model(build(card), devices=8)
    assert "--quantize experts=" in str(info.value)
    model = build(dataclasses.replace(card, quantize=Quantize(experts="nvfp4")))
    plan = plan_model(model, devices=8)
    assert plan.shard.cores == 8
    assert {p.format for s in plan.shard.stacks for p in s.params
            if p.name.startswith(("moe.experts_", "l0_moe.experts_"))
            and not p.name.endswith("_scale")} == {"nvfp4"}         # the codes (scales: plain)
