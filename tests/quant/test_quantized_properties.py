"""Drawn cards with quantized dense weights and routed experts (formats drawn
among those the card's widths take), decoded through the kernel in strict
interpret mode against the reference on 1 and 2 devices. Each draw is a whole
interpret-mode run: two per device count, slow."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.testing import model_configs
from tests.e2e.drawn import assert_plan_matches_reference, past_the_simplest


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_drawn_quantized_models_match_the_reference(devices):
    @settings(max_examples=2, deadline=None, database=None, phases=(Phase.generate,),
              print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(past_the_simplest(st.tuples(
        model_configs(cores=devices, max_layers=3, moe=True,
                      require=("quantized_dense", "quantized_experts")),
        st.integers(1, 4), st.integers(1, 2))))
    def prop(request):
        card, batch, tokens = request
        model = build(card)
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens)
        assert_plan_matches_reference(model, plan)

    prop()
