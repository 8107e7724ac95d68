"""The latent MoE's two forms (tests/latent_moe_cards.py) decoded through the
kernel in strict interpret mode against the reference, on 1, 2 and 4 cores:
Muse Spark's (an f32 router with a logit scale on the full width, each
pick's output input-scaled-normed by the expert_combine node after the
picks' all-reduce, so its experts split either way: every expert on every
core split along its width, tp = cores, or whole experts over the cores, ep
= cores), its latent projections split by rows over the cores; and Kimi
K3's (the latent sum's norm after its all-reduce, full-width shared experts
beside it). The check's tolerances are its own
(per dtype, backends/pallas_tpu/check); each case's measured error is given
beside it as a fraction of the logits' and the caches' tolerance."""

import dataclasses

import pytest

from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.request import Overrides
from megakernel.ir.config import build
from tests.e2e.drawn import assert_plan_matches_reference
from tests.latent_moe_cards import KIMI, MUSE, in_dtype

TOP4 = dataclasses.replace(MUSE, moe=dataclasses.replace(MUSE.moe, top_k=4))
MUSE4 = dataclasses.replace(MUSE, num_kv_heads=4)
CASES = [  # (id, card, devices, batch, tokens, overrides); measured: logits, caches
    ("muse-f32-1dev", MUSE, 1, 2, 1, {}),                    # 0.050, 0.092
    ("muse-bf16-2dev-tp", in_dtype(MUSE, "bfloat16"), 2, 2, 1,
     {"moe_parallel": "tp"}),                                # 0.150, 0.194
    ("muse-bf16-2dev-ep", in_dtype(MUSE, "bfloat16"), 2, 2, 1,
     {"moe_parallel": "ep"}),                                # 0.132, 0.194
    ("kimi-f32-2dev-t2", KIMI, 2, 2, 2, {}),                 # 0.036, 0.069
    ("kimi-bf16-1dev", in_dtype(KIMI, "bfloat16"), 1, 3, 1, {}),    # 0.000 (1e-6 abs), 0.000
]
SLOW = [
    # an expert in 2 slices: the per-expert norm of their sum
    ("muse-f32-1dev-sliced", MUSE, 1, 2, 1, {"slot_chunks": 2}),       # 0.044, 0.092
    ("kimi-bf16-2dev-ep", in_dtype(KIMI, "bfloat16"), 2, 2, 1,
     {"moe_parallel": "ep"}),                                # 0.125, 0.190
    ("muse-f32-4dev-tp", MUSE4, 4, 2, 1, {"moe_parallel": "tp"}),   # 0.057, 0.101
    ("muse-f32-4dev-ep", MUSE4, 4, 2, 1, {"moe_parallel": "ep"}),   # 0.052, 0.126
    # top_k x latent = 2 x hidden: the picks' all-reduce in two pieces, both algorithms
    ("muse-top4-bf16-2dev-tp-rs", in_dtype(TOP4, "bfloat16"), 2, 2, 1,
     {"moe_parallel": "tp", "allreduce": "rs_ag"}),          # 0.109, 0.197
    # the picks' all-reduce with an algorithm of its own (its spec
    # allreduce_wide) beside the one-shot of the hidden-width sites
    ("muse-top4-bf16-2dev-tp-wide-rs", in_dtype(TOP4, "bfloat16"), 2, 2, 1,
     {"moe_parallel": "tp", "allreduce": "one_shot", "allreduce_wide": "rs_ag"}),
    # 0.097, 0.197
    # gpt-oss's expert biases under a per-expert norm: each expert's down bias
    # is part of the output its norm reads (a drawn card found it added after),
    # added once per expert (one core of its width's split)
    ("muse-bias-f32-2dev-sliced-tp", dataclasses.replace(MUSE, moe=dataclasses.replace(
        MUSE.moe, expert_bias=True)), 2, 2, 1,
     {"slot_chunks": 2, "moe_parallel": "tp"}),              # 0.052, 0.105
]


def _check(card, devices, batch, tokens, overrides):
    model = build(card)
    plan = plan_model(model, devices=devices, batch=batch, tokens=tokens,
                      overrides=Overrides(**overrides))
    wanted = {"tp": 1, "ep": devices}.get(overrides.get("moe_parallel"))
    assert wanted is None or plan.shard.ep == wanted         # the split asked for
    return assert_plan_matches_reference(model, plan)


@pytest.mark.parametrize("card, devices, batch, tokens, overrides", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_latent_moe_matches_reference(card, devices, batch, tokens, overrides):
    _check(card, devices, batch, tokens, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("card, devices, batch, tokens, overrides", [c[1:] for c in SLOW],
                         ids=[c[0] for c in SLOW])
def test_latent_moe_matches_reference_slow(card, devices, batch, tokens, overrides):
    _check(card, devices, batch, tokens, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_drawn_latent_moe_cards_match_the_reference(devices):
    """Drawn cards with every latent MoE feature on (testing/moe_strategies.py),
    the others on a coin: a few draws, each a whole interpret-mode run."""
    from hypothesis import HealthCheck, Phase, given, settings

    from megakernel.testing import model_configs
    from tests.e2e.drawn import past_the_simplest

    @settings(max_examples=3, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(past_the_simplest(model_configs(cores=devices, max_layers=3, require=(
        "moe_latent", "moe_expert_norm", "moe_muse_router"))))
    def prop(card):
        model = build(card)
        assert_plan_matches_reference(model, plan_model(model, devices=devices, batch=2,
                                                        tokens=1))

    prop()


@pytest.mark.aot
@pytest.mark.parametrize("allreduce, chunks", [("one_shot", 1), ("rs_ag", 2)])
def test_split_experts_and_projections_compile_for_tpu7x(allreduce, chunks, tmp_path):
    """Mosaic takes the per-slot MoE (an expert's slices placed once, after
    the last), the picks' all-reduce in two pieces of [rows, hidden] (top_k x
    latent = 2 x hidden), the combine and the row-split projections' local
    slices (2 cores, tp = 2, bf16)."""
    pytest.importorskip("libtpu")
    from megakernel.backends.pallas_tpu.aot.tpu_compile import aot_compile
    from megakernel.backends.pallas_tpu.codegen.load import compile_model

    model = build(in_dtype(TOP4, "bfloat16"))
    plan = plan_model(model, devices=2, batch=2, tokens=1,
                      overrides=Overrides(moe_parallel="tp", allreduce=allreduce,
                                          slot_chunks=chunks))
    assert next(s for s in plan.collectives.sites if s.tensor == "slots").fold == 2
    compile_model(model, plan, tmp_path)
    result = aot_compile(tmp_path, plan, topology="tpu7x:2x2x1")
    assert result.vmem_used_bytes is not None
    assert result.vmem_used_bytes <= result.vmem_limit_bytes
