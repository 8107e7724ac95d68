"""Drawn models that always have layer patterns (of period 2 or 3), final-logit
soft-capping, o_bias and softmax_scale together, with the other features on a coin, and
model_graphs' elementwise kinds, decoded through the kernel in strict interpret
mode against the reference on 1 and 2 devices (tests/e2e/test_kernel_properties.py
draws every feature on a coin). Each draw is a whole interpret-mode run, so
each pair gets few, without shrinking (a failing draw is already small): two
graphs (their elementwise kinds are drawn only here) and one config (whose
features test_kernel_properties.py also draws)."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models.weights import init_weights
from megakernel.testing import model_configs, model_graphs
from tests.e2e.drawn import past_the_simplest

REQUIRED = ("layer_pattern", "final_logit_softcap", "o_bias", "softmax_scale")
EXAMPLES = {"configs": 1, "graphs": 2}


def models(kind: str, devices: int):
    if kind == "graphs":
        return model_graphs(cores=devices, max_layers=3)
    return model_configs(cores=devices, max_layers=4, require=REQUIRED).map(build)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["configs", "graphs"])
@pytest.mark.parametrize("devices", [1, 2])
def test_drawn_features_match_the_reference(kind, devices):
    @settings(max_examples=EXAMPLES[kind], deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(past_the_simplest(st.tuples(models(kind, devices), st.integers(1, 3),
                                        st.integers(1, 2))))
    def prop(request):
        model, batch, tokens = request
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens)
        try:
            result = check_kernel(model, plan, init_weights(model, seed=1), steps=2, seed=2)
        finally:
            pltpu.reset_tpu_interpret_mode_state()
        assert result.ok, result

    prop()
