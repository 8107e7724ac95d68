"""Infeasible requests fail with the tensor and the numbers; overrides hold."""

import dataclasses
import json

import pytest
from compiler_cases import ZOO

from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.target import make_target
from megakernel.errors import PlanningError, ShardingError
from megakernel.ir.config import ModelConfig, MoEConfig, build
from megakernel.ir.weight_kinds import Quantize
from megakernel.models import zoo

SMALL = ModelConfig("small", 512, 256, 2, 8, 2, 64, 512, max_seq_len=256)
SMALL_MOE = dataclasses.replace(SMALL, name="small_moe", moe=MoEConfig(8, 2, 256))


def test_heads_with_no_legal_split_name_the_tensor_and_counts():
    with pytest.raises(ShardingError) as info:
        plan_model(build(ZOO["qwen3-32b"][0]), devices=3)
    err = info.value
    assert err.path == "shard.layers.0.attention.num_q_heads"
    assert "num_q_heads=64" in str(err) and "3 TensorCores" in str(err)
    assert "[1, 2, 4, 8, 16, 32]" in err.hint


def test_kv_heads_that_neither_split_nor_replicate():
    model = build(ModelConfig("kv3", 512, 768, 1, 12, 3, 64, 512))
    with pytest.raises(ShardingError, match=r"num_kv_heads=3 neither splits over nor "
                                            r"replicates evenly onto 4 TensorCores"):
        plan_model(model, devices=4)


def test_budget_too_small_for_any_ring():
    target = make_target("tpu7x", 8, vmem_reserve=63 * 2**20)
    with pytest.raises(PlanningError) as info:
        plan_model(build(ZOO["qwen3-32b"][0]), target=target, devices=8)
    err = info.value
    assert err.path == "plan.ring"
    assert "1.00 MiB is too small for any ring" in str(err)
    assert "2 banks x 128 KiB" in str(err) and "MiB" in str(err)


def test_a_float8_format_on_a_chip_without_a_float8_matmul_is_named():
    """fp8_b128 codes go to the MXU as float8 (formats.Format.mxu); v5e has no
    float8 matmul (pltpu), so the plan names the weight and what to change."""
    model = build(dataclasses.replace(zoo.card("tiny-dense"), quantize=Quantize(dense="fp8_b128")))
    with pytest.raises(PlanningError, match=r"feeds float8 codes to the MXU; v5e has no float8") \
            as info:
        plan_model(model, target="v5e", devices=1)
    assert info.value.path.startswith("shard.layers.0.") and "tpu7x" in info.value.hint
    assert plan_model(model, target="v6e", devices=1).cost.step_ms > 0


def test_hbm_overflow_names_the_bytes():
    with pytest.raises(PlanningError, match=r"plan\.hbm: .* GB of HBM per core, capacity 103\.0 GB"):
        plan_model(build(ZOO["mixtral-8x7b"][0]), devices=1, batch=8)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(devices=8, overrides={"moe_parallel": 3}), ShardingError, "expert-parallel degree 3"),
    (dict(devices=2, overrides={"bank_size": 1}), PlanningError, "unknown overrides"),
    (dict(devices=2, overrides={"bank_bytes": 5000}), PlanningError, "bank_bytes=5000 must be a multiple of 4096"),
    (dict(devices=2, context=10_000), PlanningError, "context=10000"),
    (dict(devices=33), PlanningError, "1..32"),
    (dict(devices=2, overrides={"logits": "topk"}), PlanningError, "logits='topk'"),
    (dict(devices=2, overrides={"wire": "float16"}), PlanningError, "wire='float16'"),
])
def test_bad_requests(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_model(build(SMALL_MOE), **kwargs)


def test_overrides_are_held():
    plan = plan_model(build(SMALL_MOE), devices=4, batch=2, overrides=dict(
        bank_bytes=256 * 1024, num_banks=5, expert_slots=3, kv_tile=64, moe_parallel="ep",
        allreduce="one_shot", logits="gather", embed="replicated", wire="float32"))
    g = plan.memory.geometry
    assert (g.bank_bytes, g.num_banks, g.expert_slots, g.kv_tile) == (256 * 1024, 5, 3, 64)
    assert plan.shard.ep == 4
    assert plan.collectives.spec("allreduce").algorithm == "one_shot"
    assert plan.collectives.wire == "float32"
    assert plan.memory.buffer("allreduce.slots").dtype == "float32"
    assert plan.collectives.specs[-1].kind == "all_gather"
    assert plan.memory.buffer("logits.gathered").space.value == "hbm"
    assert not any(s.name == "embed.allreduce" for s in plan.collectives.sites)
    assert plan.shard.global_param("embed.weight").splits == ()


def test_plan_exports_json_and_a_stable_digest():
    a = plan_model(build(SMALL), devices=2)
    b = plan_model(build(SMALL), devices=2)
    assert a.digest() == b.digest()
    data = json.loads(a.to_json())
    assert data["format"] == "megakernel.plan/1"
    assert data["memory"]["geometry"] == dataclasses.asdict(a.memory.geometry)
    assert data["cost"]["label"].startswith("modeled")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.model = "x"


def test_expert_rows_counts_the_distinct_experts_a_layer_loads():
    """expert_rows=1 models a batch whose rows all route alike: a layer loads
    top_k experts, not batch x top_k, and the HBM floor and the step shrink;
    the default (every row distinct) keeps the plan's digest."""
    model = zoo.model("qwen3-30b-a3b")
    worst = plan_model(model, devices=8, batch=4, tokens=1)
    alike = plan_model(model, devices=8, batch=4, tokens=1, overrides={"expert_rows": 1})
    top_k = model.stacks[0].layer.node("moe").op.top_k
    (w,), (a,) = worst.memory.experts, alike.memory.experts
    assert w.max_distinct == min(w.experts_local, 4 * top_k)
    assert a.max_distinct == min(a.experts_local, top_k) < w.max_distinct
    assert alike.cost.floor_bytes_per_core < worst.cost.floor_bytes_per_core
    assert alike.cost.step_ms < worst.cost.step_ms
    same = plan_model(model, devices=8, batch=4, tokens=1, overrides={"expert_rows": 4})
    assert same.memory.experts == worst.memory.experts
    with pytest.raises(PlanningError, match="expert_rows=0 must be a positive integer"):
        plan_model(model, devices=8, batch=4, tokens=1, overrides={"expert_rows": 0})
