"""Acceptance: the zoo at full size plans within budget in under 2 s each, and
its report shows the modeled step time, the HBM floor and the efficiency."""

import time

import pytest
from compiler_cases import ZOO

from megakernel.compiler import report
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.target import make_target
from megakernel.ir.config import build


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_plans_fast_and_within_budget(name):
    config, devices = ZOO[name]
    model = build(config)
    make_target("tpu7x", devices)            # pltpu import and chip table, once
    start = time.perf_counter()
    plan = plan_model(model, devices=devices, batch=1, tokens=1)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"{name} planned in {elapsed:.2f} s"
    m = plan.memory
    assert m.vmem_total <= m.vmem_budget
    assert max(m.live_vmem(p.index) for p in m.points) <= m.vmem_budget
    text = report.terminal(plan)
    md = report.markdown(plan)
    for needle in ("modeled step time", "HBM floor", "modeled efficiency", "headroom",
                   "Ring geometry", "Collectives"):
        assert needle in text and needle in md
    assert f"{plan.cost.step_ms:.3f} ms per step" in text
    assert 0 < plan.cost.efficiency <= 1
    # The stream stays compact: one tile list per stack, not per layer.
    assert len(m.stream.stacks) == len(model.stacks)


def test_moe_split_is_chosen_by_the_cost_model():
    config, devices = ZOO["qwen3-30b-a3b"]
    plan = plan_model(build(config), devices=devices, batch=1)
    why = dict(plan.choices)["moe_parallel"]
    assert f"ep={plan.shard.ep} (modeled" in why and "ep=8" in why
