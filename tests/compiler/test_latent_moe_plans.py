"""Plans of the latent MoE (tests/latent_moe_cards.py): how each form is split
over cores, where the all-reduces sit, which splits a per-expert norm leaves
the planner, and the cost model's expert phase at the latent width."""

import dataclasses

import pytest

from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.plan import Plan
from megakernel.compiler.request import Overrides
from megakernel.compiler.shard import legal_core_counts, moe_degrees, shard_model
from megakernel.errors import ShardingError
from megakernel.ir.config import build
from tests.latent_moe_cards import KIMI, MUSE


def _moe(card, **fields):
    return dataclasses.replace(card, moe=dataclasses.replace(card.moe, **fields))


def _sites(plan):
    return {(r.tensor, r.producer, r.consumer) for r in plan.shard.stacks[-1].reductions}


def _roles(plan):
    return {p.name: (p.shape, p.dtype, p.role) for p in plan.shard.stacks[-1].params}


def test_muse_splits_its_experts_and_reduces_the_picks_before_their_norm():
    plan = plan_model(build(MUSE), devices=2, batch=2, tokens=1)
    assert plan.shard.stacks[-1].experts[0][1:3] in ((1, 2), (2, 1))
    assert dict(plan.choices)["moe_parallel"].startswith(f"ep={plan.shard.ep} (modeled ep=1")
    # The MoE op emits each row's picks apart ([rows, top_k x latent], partial);
    # they are all-reduced before the combine that norms, weights and sums them,
    # and the latent sum after it is whole: nothing reduced before post_expert_proj.
    sites = _sites(plan)
    assert ("slots", "moe", "expert_combine") in sites
    assert not any(s[2] == "post_expert_proj" for s in sites)
    assert plan.shard.stacks[-1].width("slots") == 2 * 128
    roles = _roles(plan)
    assert roles["expert_combine.weight"] == ((128,), "float32", "replicated")
    # The latent projections read whole tensors but are split by rows
    # (Linear.split_rows): each core streams half of them, and their partial
    # outputs are all-reduced before the pre-norm and the residual add.
    assert roles["pre_expert_proj.weight"] == ((128, 128), "float32",
                                               "rows (a local slice of the whole input)")
    assert roles["post_expert_proj.weight"][0] == (64 * 2, 256)
    assert {("x_latent", "pre_expert_proj", "pre_expert_norm"),
            ("ffn_out", "post_expert_proj", "ffn_residual")} <= sites
    bf16 = plan_model(build(dataclasses.replace(MUSE, dtype="bfloat16")), devices=1, batch=1,
                      tokens=1)
    assert _roles(bf16)["moe.router"] == ((256, 8), "float32", "replicated")   # router_f32


def test_kimi_norms_the_reduced_sum_and_adds_the_full_width_shared_experts():
    plan = plan_model(build(KIMI), devices=2, batch=2, tokens=1)
    sites = _sites(plan)
    # the row-split up projection and the shared experts both end in partial
    # sums: added as partials, reduced once before the residual add
    assert {("routed", "moe", "expert_output_norm"), ("x_latent", "pre_expert_proj", "moe"),
            ("ffn_out", "shared_add", "ffn_residual")} <= sites
    assert not any(s[1] == "shared_experts" for s in sites)
    assert not any(s[1] == "post_expert_proj" for s in sites)
    roles = _roles(plan)
    assert roles["shared_experts.gate"][2] == "columns of intermediate"
    assert roles["moe.experts_gate"][2].startswith("experts over")
    assert plan.shard.stacks[-1].experts[0][1:3] in ((1, 2), (2, 1))


@pytest.mark.parametrize("cores", [2, 4])
def test_a_per_expert_norm_allows_every_split_of_the_experts(cores):
    model = build(MUSE)
    assert moe_degrees(model, cores) == [d for d in (1, 2, 4) if d <= cores]
    tp = plan_model(model, devices=cores, batch=1, tokens=1,
                    overrides=Overrides(moe_parallel="tp"))
    assert tp.shard.stacks[-1].experts == (("moe", 1, cores, 8, 128),)   # every expert, 1/N wide
    ep = plan_model(model, devices=cores, batch=1, tokens=1,
                    overrides=Overrides(moe_parallel="ep"))
    assert ep.shard.stacks[-1].experts == (("moe", cores, 1, 8 // cores, 256),)
    # the picks' all-reduce is costed at its own bytes: top_k x latent = 256
    # features a row, the hidden size here, so one piece of the slots
    site = next(s for s in tp.collectives.sites if s.tensor == "slots")
    assert site.fold == 1
    # 6 experts split over 4 cores only by their width now, as without the norm
    six = build(_moe(MUSE, num_experts=6))
    assert 4 in legal_core_counts(six)
    assert shard_model(six, 4, moe_parallel="tp").ep == 1
    with pytest.raises(ShardingError, match="num_experts=\\[6\\]"):
        shard_model(six, 4, moe_parallel="ep")


def test_tp_over_all_cores_streams_one_nth_of_the_projections_and_experts():
    """A per-expert norm under moe_parallel='tp' on N cores: every expert on
    every core at 1/N of its width, the two latent projections 1/N of their
    rows each, at widths that split into whole 128-lane tiles (hidden 1024,
    latent 512, expert width 1024 over 4 cores); four all-reduces per layer
    (o_proj, pre_expert_proj, the picks, post_expert_proj)."""
    card = _moe(dataclasses.replace(MUSE, hidden_size=1024, num_kv_heads=4),
                latent_size=512, expert_intermediate=1024)
    one = plan_model(build(card), devices=1, batch=1, tokens=1)
    four = plan_model(build(card), devices=4, batch=1, tokens=1,
                      overrides=Overrides(moe_parallel="tp"))
    assert four.shard.stacks[-1].experts == (("moe", 1, 4, 8, 256),)
    full = {p.name: p.nbytes for p in one.shard.stacks[-1].params}
    core = {p.name: p.nbytes for p in four.shard.stacks[-1].params}
    for name in ("pre_expert_proj.weight", "post_expert_proj.weight", "moe.experts_gate",
                 "moe.experts_up", "moe.experts_down"):
        assert core[name] * 4 == full[name], name
    assert len(four.shard.stacks[-1].reductions) == 4
    # the ring streams the projections' quarter: the phase's bytes say so
    phases = {p.name: p for p in four.cost.phases}
    assert phases["s0.pre_expert_proj"].hbm_bytes == full["pre_expert_proj.weight"] // 4


def test_picks_wider_than_hidden_travel_in_pieces_and_cost_more():
    """top_k x latent = 4 x 128 = 2 x hidden: the slots' all-reduce moves two
    [rows, hidden] pieces, its slots hold two, and its modeled time is that of
    its bytes (more than the hidden-width o_proj all-reduce's)."""
    plan = plan_model(build(_moe(MUSE, top_k=4)), devices=2, batch=2, tokens=1,
                      overrides=Overrides(moe_parallel="tp"))
    site = next(s for s in plan.collectives.sites if s.tensor == "slots")
    spec = plan.collectives.spec(site.spec)
    assert (site.fold, spec.fold) == (2, 2)
    assert spec.buffers[0].shape[2] == 2          # [parity, sender, piece, rows, hidden]
    phases = {p.name: p for p in plan.cost.phases}
    assert phases["s0.allreduce.slots"].stall_s > phases["s0.allreduce.attn_out"].stall_s
    # each site moves its pieces (the picks: 2); in slots folded for them a
    # narrower partial (x_latent, 128 of 256 lanes) is padded to one piece
    c = plan.collectives
    assert not any(s.lanes for s in c.sites)
    assert c.remote_bytes(2) == sum(
        s.per_step * c.spec(s.spec).phases * c.spec(s.spec).bytes_per_peer
        * (s.fold if not s.lanes else s.lanes / c.spec(s.spec).payload[1]) for s in c.sites)


def test_the_picks_get_an_all_reduce_of_their_own_when_its_algorithm_differs():
    """The picks' site moves fold x the bytes of the hidden-width sites; with
    another algorithm it gets a spec of its own (allreduce_wide: its own
    buffers and semaphores), and with the same one they share a spec."""
    card = _moe(MUSE, top_k=4)
    mixed = plan_model(build(card), devices=2, batch=2, tokens=1, overrides=Overrides(
        moe_parallel="tp", allreduce="one_shot", allreduce_wide="rs_ag"))
    c = mixed.collectives
    assert [(s.name, s.algorithm, s.fold) for s in c.specs if s.kind == "all_reduce"] == [
        ("allreduce", "one_shot", 1), ("allreduce_wide", "rs_ag", 2)]
    assert {s.tensor for s in c.sites if s.spec == "allreduce_wide"} == {"slots"}
    names = {b.name for b in mixed.memory.buffers}
    assert {"allreduce.slots", "allreduce_wide.stage", "allreduce_wide.rs_slots",
            "allreduce_wide.ag_slots", "allreduce_wide.send_sems"} <= names
    assert c.remote_bytes(2) == sum(
        s.per_step * c.spec(s.spec).phases * c.spec(s.spec).site_bytes_per_peer(s.fold, s.lanes)
        for s in c.sites)
    same = plan_model(build(card), devices=2, batch=2, tokens=1,
                      overrides=Overrides(moe_parallel="tp", allreduce="rs_ag"))
    assert [(s.name, s.fold) for s in same.collectives.specs if s.kind == "all_reduce"] == [
        ("allreduce", 2)]


def test_muse_spark_reduces_its_picks_in_two_phases_and_the_rest_in_one():
    """At full size on 8 cores a layer's picks are [1, 8 x 4096] (4 pieces of
    hidden): reduce-scatter + all-gather moves an eighth of that per peer in
    each of its two phases and is faster than one shot; the hidden-width
    sites stay one-shot. The cost model chose both."""
    from bench import musespark

    config = "NVFP4 experts + int8 dense + lm_head"
    own = musespark.plan(config, 1, musespark.OWN)
    specs = {s.name: (s.algorithm, s.fold) for s in own.collectives.specs}
    assert specs["allreduce"] == ("one_shot", 1) and specs["allreduce_wide"] == ("rs_ag", 4)
    shot = musespark.plan(config, 1, dict(musespark.OWN, allreduce_wide="one_shot"))
    assert "allreduce_wide" not in {s.name for s in shot.collectives.specs}
    stall = lambda p: next(ph.stall_s for ph in p.cost.phases  # noqa: E731
                           if ph.name == "s0.allreduce.l0_slots")
    assert stall(own) < stall(shot)


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
    assert (g.per_slot, g.expert_output_norm, g.renormalize_eps) == (True, False, 1e-15)
    # the geometry of a MoE without the new options writes none of their fields,
    # so earlier plans keep their JSON and digests
    plain = plan_model(build(_moe(KIMI, latent_size=0, expert_output_norm="none")), devices=1,
                       batch=1, tokens=1)
    (g,) = [og for og in plain.to_dict()["memory"]["geometries"] if og["library"] == "moe"]
    assert not {"router_logit_scale", "expert_output_norm", "per_slot"} & set(g["geometry"])


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
