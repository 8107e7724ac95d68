"""DeepSeek-V3 and Kimi-K2 at full size on 32 TensorCores (tpu7x:4x4x1): plans
within the VMEM budget and HBM, the MLA form chosen by the cost model with both
forms' modeled costs in the report, and the replicated latent cache's bytes."""

import dataclasses

import pytest

from megakernel.compiler import report
from megakernel.compiler.kind_mla import form_costs
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.target import make_target
from megakernel.ir.config import MLAConfig, ModelConfig, build
from megakernel.ir.weight_kinds import Quantize
from megakernel.models import zoo


@pytest.fixture(scope="module")
def plans():
    return {name: plan_model(zoo.model(name), devices=32, batch=1, tokens=1)
            for name in ("deepseek-v3", "kimi-k2")}


@pytest.mark.parametrize("name, heads, ep", [("deepseek-v3", 4, 1), ("kimi-k2", 2, 2)])
def test_full_size_plans_fit(plans, name, heads, ep):
    plan = plans[name]
    m = plan.memory
    assert m.vmem_total <= m.vmem_budget and m.hbm_total <= m.hbm_capacity
    assert plan.shard.ep == ep
    (mla_heads,) = {h[1] for st in plan.shard.stacks for h in st.heads}
    assert mla_heads == heads
    text = report.terminal(plan, buffers=False)
    # the latent cache: c_kv 512 + k_pe 64 values, bf16, on every core
    assert "mla.latent (append state): 58x1x4096x576 bfloat16" in text or \
        "mla.latent (append state): 60x1x4096x576 bfloat16" in text
    assert "1,152 B per token per layer, replicated on every core" in text
    assert "absorbed form (the cheaper modeled compute; modeled per layer: absorbed" in text
    assert plan.cost.label.startswith("modeled")


def test_kimi_k2_tensor_parallel_experts_overflow_hbm(plans):
    """384 experts of 2048 over 32 cores: 64-wide slices padded to 128 lanes
    need 130 GB per core; the planner says so and takes ep=2."""
    why = dict(plans["kimi-k2"].choices)["moe_parallel"]
    # 130.2 GB since one-row arrays (norm vectors) are tiled by one 32-bit
    # sublane as Mosaic lays them out (layout.padded_shape), not 16 rows
    assert "ep=1: does not fit HBM (weights, caches and outputs need 130.2 GB" in why


def test_forms_modeled_cost():
    """The absorbed form pays W_UK / W_UV once per step, the expanded one per
    tile and head: expanded wins only with few heads and a short context."""
    c = make_target("tpu7x", 32).constants
    ds = zoo.model("deepseek-v3").layers[0].node("mla").op

    def both(heads, tiles, tile=256):
        return form_costs(ds, heads, 8, tile, tiles, c, 1e15)

    one = both(1, 1, 128)
    assert one["expanded"] < one["absorbed"]
    many = both(4, 8)
    assert many["absorbed"] < many["expanded"]


def test_the_planner_takes_the_expanded_form_when_it_is_cheaper():
    card = ModelConfig(name="mla-few-heads", vocab_size=512, hidden_size=256, num_layers=2,
                       num_q_heads=2, num_kv_heads=2, head_dim=192, intermediate_size=256,
                       max_seq_len=256, mla=MLAConfig(512, 128, 64, 128))
    model = build(card)
    short = plan_model(model, devices=2, batch=1, tokens=1, context=64)
    assert "expanded form (the cheaper" in dict(short.choices)["mla s0.mla"]
    long = plan_model(model, devices=1, batch=4, tokens=1, context=240)
    assert "absorbed form (the cheaper" in dict(long.choices)["mla s0.mla"]
    forced = plan_model(model, devices=1, batch=4, tokens=1, context=240,
                        overrides={"mla_form": "expanded"})
    assert "expanded form (set by overrides.mla_form" in dict(forced.choices)["mla s0.mla"]
    assert forced.memory.geometry_of(0, "mla").geometry.form == "expanded"


def test_deepseek_v3_in_fp8_plans_on_16_cores():
    """Shipped fp8 (dense and experts) halves the weights, so DeepSeek-V3 fits
    16 TensorCores. It did not plan: its first geometries and the slot search
    around them do not fit, and the search gave up (naming a tile only the
    smallest bank size could not hold); it now starts again from the smallest
    layout that plans, and fp8 blocks may be cut to 1, 2 or 4 scale rows."""
    model = build(dataclasses.replace(zoo.card("deepseek-v3"),
                                      quantize=Quantize(dense="fp8_b128", experts="fp8_b128")))
    plan = plan_model(model, devices=16, batch=1, tokens=1)
    m = plan.memory
    assert m.vmem_total <= m.vmem_budget and m.hbm_total <= m.hbm_capacity
    assert {p.format for ss in plan.shard.stacks for p in ss.params} >= {"fp8_b128"}
    # one-byte codes on 16 cores: about bf16's bytes per core on 32 (scales on top)
    bf16 = plan_model(zoo.model("deepseek-v3"), devices=32, batch=1, tokens=1)
    assert m.hbm_total < 1.2 * bf16.memory.hbm_total
