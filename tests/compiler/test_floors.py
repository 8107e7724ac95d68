"""The three floors under a plan's step, against counts made from the model itself."""

import math

import pytest

from megakernel.compiler import calibration
from megakernel.compiler.floors import (HBM_SUSTAINED, floors, modeled_compute_ms,
                                       with_core_work)
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
    # the binding floor is the HBM floor a core can reach: at the sustained rate
    assert f.binding == "hbm" and f.efficiency == pytest.approx(f.hbm_sustained_ms / c.step_ms)
    assert f.sustained_efficiency == f.efficiency > f.hbm_efficiency
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


# Every bench row (bench/config.py) at batch 1: planning only.
ZOO_ROWS = (("tiny-dense", 1), ("tiny-moe", 1), ("llama-3.2-1b", 1), ("gemma-3-1b", 1),
            ("gemma-2-2b", 4), ("phi-3-mini-4k", 4), ("qwen3-8b", 4), ("mistral-7b-v0.1", 8),
            ("olmo-2-7b", 8), ("qwen3-32b", 8), ("qwen3-30b-a3b", 8), ("mixtral-8x7b", 8),
            ("gpt-oss-20b", 8), ("qwen3.5-27b", 8), ("qwen3-next-80b-a3b", 8),
            ("deepseek-v3", 32), ("kimi-k2", 32))


def test_the_rows_are_the_benchs():
    from bench.config import MODELS

    assert ZOO_ROWS == MODELS


@pytest.mark.parametrize("name,cores", ZOO_ROWS)
def test_no_modeled_step_below_its_sustained_hbm_floor(name, cores):
    """The cost model streams at most 3.2 TB/s (compiler/measured.py), so a step
    reads its floor bytes no faster than the sustained rate allows."""
    plan = plan_model(zoo.model(name), devices=cores, batch=1, tokens=1)
    f = floors(plan)
    assert plan.cost.step_ms >= f.hbm_sustained_ms
    assert f.efficiency <= 1.0


def test_core_work_scales_the_compute_it_exceeds(llama):
    """A busy core work above the modeled compute re-models the step with every
    phase's compute scaled to it; below, the plan's own cost stands."""
    mine = modeled_compute_ms(llama.cost)
    scale, cost = with_core_work(llama, 0.5 * mine)
    assert scale == 1.0 and cost is llama.cost
    scale, cost = with_core_work(llama, 3.0 * mine)
    assert scale == pytest.approx(3.0)
    assert modeled_compute_ms(cost) == pytest.approx(3.0 * mine, rel=1e-9)
    # three times the compute of an HBM-bound plan: the step is the compute now
    assert cost.step_ms >= 3.0 * mine > llama.cost.step_ms
