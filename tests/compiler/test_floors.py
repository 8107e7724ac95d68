"""The three floors under a plan's step, against counts made from the model itself."""

import math

import pytest

from megakernel.compiler import calibration
from megakernel.compiler.floors import HBM_SUSTAINED, floors
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.schedule_collectives import phase_seconds
from megakernel.models import zoo


@pytest.fixture(scope="module")
def llama():
    return plan_model(zoo.model("llama-3.2-1b"), devices=1, batch=1, tokens=1)


def test_core_floor_counts_every_weight_at_its_layout_rate(llama):
    """Independent count from the model's parameters (not the plan's stream): every
    2-D layer weight [K, N] at the bf16 rate, and the tied embedding too: the LM
    head streams a [hidden, vocab] copy of it, never [vocab, hidden] at the
    transposed (half) rate."""
    model, cal = llama.model, calibration.load()
    layer = sum(math.prod(p.shape) for name, p in model.params().items()
                if name.startswith("layers.") and len(p.shape) == 2)
    head = model.vocab_size * model.hidden_size
    assert model.tie_embeddings
    assert cal.weights_per_cycle("bfloat16", True, "t") < cal.weights_per_cycle(
        "bfloat16", False, "t")
    cycles = (layer + head) / cal.weights_per_cycle("bfloat16", False, "t")
    f = floors(llama)
    assert f.core_ms == pytest.approx(cycles / cal.rate("clock_hz") * 1e3, rel=1e-9)
    assert dict(f.weights_by_format) == {"bfloat16.kn": layer + head}


def test_hbm_floors_and_the_binding_one(llama):
    f, c = floors(llama), llama.cost
    assert f.hbm_ms == pytest.approx(c.floor_bytes_per_core / 3.7e12 * 1e3)
    assert f.hbm_sustained_ms == pytest.approx(c.floor_bytes_per_core / HBM_SUSTAINED.value * 1e3)
    # one core: no collective, only the launch
    assert f.latency_ms == pytest.approx(c.launch_ms)
    assert f.binding == "hbm" and f.efficiency == pytest.approx(f.hbm_ms / c.step_ms)
    assert any("binding floor: hbm" in line for line in f.lines())


def test_latency_floor_counts_each_collective_phase():
    """tiny-moe on 2 cores: per step, the embedding's all-reduce, two per layer, the
    logits gather, each a phase of sibling-core latency; it binds, not HBM."""
    plan = plan_model(zoo.model("tiny-moe"), devices=2, batch=1, tokens=1)
    phases = sum(s.per_step * plan.collectives.spec(s.spec).phases
                 for s in plan.collectives.sites)
    assert phases >= 2 * len(plan.model.layers) + 2
    f = floors(plan)
    assert f.latency_ms == pytest.approx(plan.cost.launch_ms
                                         + phases * phase_seconds(0, plan.target) * 1e3)
    assert f.binding == "latency" and f.efficiency > f.hbm_efficiency
