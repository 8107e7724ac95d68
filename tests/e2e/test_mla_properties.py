"""Property test: hypothesis draws small multi-head latent attention models
(heads, q and kv LoRA ranks, nope / rope / value widths, NoPE, output gate,
YaRN, DeepSeek routing with groups, dense first layers), a decode request
(batch 1-4, 1-4 tokens per step) and the MLA form; the generated kernel must
match the reference in strict interpret mode (race detector on, OOB reads
raise) on greedy tokens, logits and every latent cache, on 1, 2 and 4
virtual devices.

One case is a whole interpret-mode run (15-40 s), so the fast suite draws one
case per device count (about a minute in all, shrinking off: a failing draw is
already small); the slow-marked variant draws two more per device count.
Hypothesis would draw the simplest case first (one layer, the first choice of
every field, batch 1, one token, absorbed), the same in every run; both
variants rule it out (tests/e2e/drawn.py ``past_the_simplest``), so every draw
is a random one.
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import MLAConfig, ModelConfig, MoEConfig, build
from tests.e2e.drawn import assert_plan_matches_reference, past_the_simplest

YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position": 16, "mscale": 1.0,
        "mscale_all_dim": 0.7}


@st.composite
def mla_cards(draw, cores: int):
    heads = cores * draw(st.sampled_from([1, 2]))
    dn, dr, dv = (draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([8, 16])),
                  draw(st.sampled_from([8, 16, 24])))
    rope = draw(st.booleans())
    layers = draw(st.integers(1, 2))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8]))
        groups = draw(st.sampled_from([g for g in (1, 2, 4) if experts // g >= 2]))
        topk_group = draw(st.integers(1, groups))
        moe = MoEConfig(experts, draw(st.integers(1, 2)), 32, "sigmoid", correction_bias=True,
                        renormalize=True, routed_scaling=draw(st.sampled_from([1.0, 2.5])),
                        num_shared_experts=draw(st.integers(0, 1)), shared_intermediate=32,
                        n_group=groups, topk_group=topk_group if groups > 1 else 1)
    return ModelConfig(
        name="drawn-mla", vocab_size=256, hidden_size=draw(st.sampled_from([64, 128])),
        num_layers=layers, num_q_heads=heads, num_kv_heads=heads, head_dim=dn + dr,
        intermediate_size=128, dtype=draw(st.sampled_from(["float32", "bfloat16"])),
        max_seq_len=64, rope_theta=1e4, rope_scaling=YARN if rope and draw(st.booleans()) else None,
        moe=moe, first_k_dense=draw(st.integers(0, layers - 1)) if moe else 0,
        mla=MLAConfig(kv_lora_rank=draw(st.sampled_from([16, 32, 64])), qk_nope_head_dim=dn,
                      qk_rope_head_dim=dr, v_head_dim=dv,
                      q_lora_rank=draw(st.sampled_from([0, 32])), rope=rope,
                      output_gate=draw(st.booleans())))


def _requests(devices: int):
    return st.tuples(mla_cards(devices), st.integers(1, 4), st.integers(1, 4),
                     st.sampled_from(["absorbed", "expanded"]))


def _check_drawn(devices: int, examples: int):
    requests = past_the_simplest(_requests(devices))

    @settings(max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
              print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])
    @given(requests)
    def prop(request):
        card, batch, tokens, form = request
        model = build(card)
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens,
                          overrides={"mla_form": form})
        assert_plan_matches_reference(model, plan)

    prop()


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_drawn_mla_models_match_reference(devices):
    _check_drawn(devices, 1)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_more_drawn_mla_models_match_reference(devices):
    _check_drawn(devices, 2)
