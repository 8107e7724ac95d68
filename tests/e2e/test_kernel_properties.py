"""Property test: hypothesis draws small models and decode requests; the
generated kernel must match the reference in strict interpret mode (race
detector on, out-of-bounds reads raise) on 1, 2, 4 and 8 virtual devices.

The draws cover dense and MoE layers (1-4 of them), hidden 128-512, head and
KV-head counts that shard over the devices, 4-16 experts with top-k 1-4,
batch 1-8 and 1-4 tokens per step. One case is a whole interpret-mode run
(10-30 s on 8 devices with XLA at O0), so each (devices, kind) pair gets two examples and
4/8-device models are drawn with at most 2 layers; shrinking is off because a
failing draw is already small and every shrink step is another run.
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.testing import model_configs
from tests.e2e.drawn import assert_plan_matches_reference, past_the_simplest

EXAMPLES = {1: 2, 2: 2, 4: 2, 8: 2}
MAX_LAYERS = {1: 4, 2: 4, 4: 2, 8: 2}


@st.composite
def requests(draw, devices, moe):
    card = draw(model_configs(cores=devices, moe=moe, max_layers=MAX_LAYERS[devices]))
    return card, draw(st.integers(1, 8)), draw(st.integers(1, 4))


def _check_drawn(devices, moe):
    @settings(max_examples=EXAMPLES[devices], deadline=None, database=None,
              phases=(Phase.generate,), print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(past_the_simplest(requests(devices, moe)))
    def prop(request):
        card, batch, tokens = request
        model = build(card)
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens)
        assert_plan_matches_reference(model, plan)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_drawn_models_match_reference(devices, moe):
    _check_drawn(devices, moe)
