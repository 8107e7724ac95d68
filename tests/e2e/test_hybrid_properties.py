"""Property test of the hybrid family: hypothesis draws Qwen3.5-like models
(1-3 Gated DeltaNet layers per gated full-attention layer, 1-2 periods, head
counts that split or replicate over the cores, dense or Qwen3-Next MoE) and
decode requests (batch 1-4, 1-4 tokens per step); the generated kernel, in
strict interpret mode with the race detector, must equal the reference on
tokens, logits, KV caches and the conv and recurrent states, on 1, 2 and 4
virtual devices. One draw is a whole interpret-mode run (20-60 s), so each
device count gets one example per run of the suite (a new one each time: no
example database, and not hypothesis' simplest, which it would draw first:
drawn.past_the_simplest) and shrinking is off.
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models.weights import init_weights
from megakernel.testing import hybrid_configs
from tests.e2e.drawn import past_the_simplest

# Caches and states (run.check compares every one after each step): float32
# measured <= 1.4e-6; bfloat16 differs by at most one rounding of a stored value
# (2^-6 at magnitudes up to 4), as for the K/V caches of the other property test.
CACHE_TOL = {"float32": 1e-4, "bfloat16": 0.1}


@st.composite
def requests(draw, devices):
    return (draw(hybrid_configs(cores=devices)), draw(st.integers(1, 4)),
            draw(st.integers(1, 4)))


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_drawn_hybrids_match_reference(devices):
    @settings(max_examples=1, deadline=None, database=None, phases=(Phase.generate,),
              print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])
    @given(past_the_simplest(requests(devices)))
    def prop(request):
        card, batch, tokens = request
        model = build(card)
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens)
        try:
            result = check_kernel(model, plan, init_weights(model, seed=1), steps=2, seed=2)
        finally:
            pltpu.reset_tpu_interpret_mode_state()
        assert not result.races, "the race detector reported a race"
        assert result.tokens_agree, result      # near-ties: tests/e2e/drawn.py
        assert result.max_abs_err <= result.tolerance, result
        # (on a bf16 wire, run.check's state bound adds the wire's rounding)
        bound = max(CACHE_TOL[model.dtype.value], result.cache_tolerance)
        assert result.cache_max_err <= bound, result

    prop()
