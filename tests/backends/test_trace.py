"""Trace mode: the DMAs one step executes equal the plan's weight stream."""

import pytest
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu import trace
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.shard import shard_weights
from megakernel.models import zoo
from megakernel.models.weights import init_weights


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    yield
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("devices", [1, 2])
def test_dense_step_reads_every_weight_byte_once(devices, tmp_path):
    model = zoo.model("tiny-dense")
    plan = plan_model(model, devices=devices, batch=2, tokens=1)
    weights = init_weights(model)
    result = trace.trace_step(model, plan, weights, out_dir=tmp_path)
    want = trace.plan_weight_bytes(plan)
    for core in range(devices):
        got = result.bytes_by_kind(core)
        assert got["ring"] == want["ring"]
        assert got["vector"] == want["vector"]
        shard = shard_weights(model, plan.shard, weights)[core]
        streamed = sum(a.nbytes for k, a in shard.items()
                       if k not in ("embed.weight", "final_norm.weight"))
        assert got["ring"] + got["vector"] == streamed
    # every token's aligned block of 16 bf16 rows is gathered once, by its owner
    embed = sum(result.bytes_by_kind(c).get("embed", 0) for c in range(devices))
    assert embed == plan.memory.rows * 16 * model.hidden_size * model.dtype.itemsize
    if devices > 1:
        assert all(e.src_dev != e.dst_dev for e in result.events if e.kind == "collective")
